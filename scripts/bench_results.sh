#!/usr/bin/env bash
# Keep the finished runs of `megatron-pc bench rollouts` without their checkpoints and traces, to
# commit and share them, and put them back so a later benchmark call reuses them (a run whose
# metrics reach --steps counts as finished; docs/benchmarks.md), with the start model each regime
# recorded (REGIME/start_model.json), so a later machine trains further runs from the same bits.
#   scripts/bench_results.sh save    [BENCH_DIR] [RESULTS_DIR]   # runs/bench_rollouts -> results/bench_rollouts
#   scripts/bench_results.sh restore [BENCH_DIR] [RESULTS_DIR]   # results/bench_rollouts -> runs/bench_rollouts
# A validation set over 1 MB (KEEP_VALIDATION_MAX_BYTES) is kept as validation.sha256: the benchmark
# makes it again from its seed and checks it against that record.
# Kept JSON-lines files are gzip-compressed (metrics.jsonl.gz, validation.jsonl.gz: deterministic,
# megatron_pc/jsonl.py), which `report`, `decompose` and the benchmarks read as they are; restore
# puts them back plain. A start model already in git history is not copied again: the tracked
# results hold none (tests/unit/test_kept_results.py), and restore takes it from the commit before
# the one that removed it from the tree (`git show`), checking its fingerprint.
set -euo pipefail
mode=${1:?usage: scripts/bench_results.sh save|restore [BENCH_DIR] [RESULTS_DIR]}
bench=${2:-runs/bench_rollouts}
results=${3:-results/bench_rollouts}
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# The project's interpreter (the install's .venv: Pillow shrinks the plots), else python3; PYTHON overrides.
if [ -z "${PYTHON:-}" ]; then
  if [ -x "$REPO/.venv/bin/python" ]; then PYTHON="$REPO/.venv/bin/python"; else PYTHON=python3; fi
fi
# Validation sets larger than this (bytes) are kept as a SHA-256 record (see save below).
KEEP_VALIDATION_MAX_BYTES="${KEEP_VALIDATION_MAX_BYTES:-1000000}"
# A start-model record's model path and the first 12 hex digits of its fingerprint.
record_fields() {
  "$PYTHON" -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["path"], r["sha256"][:12], r["sha256"])' "$1"
}
# The benchmark's model fingerprint (benchmarks/strategies.py: model_fingerprint; a unit test keeps
# the two equal): SHA-256 over "NAME\0SHA256\n" of the deciding files present.
fingerprint() {
  local name
  for name in config.json model.safetensors tokenizer.json; do
    if [ -f "$1/$name" ]; then printf '%s\0%s\n' "$name" "$(sha256sum "$1/$name" | cut -d' ' -f1)"; fi
  done | sha256sum | cut -d' ' -f1
}
# The files a kept start model had in git history, as "COMMIT PATH" lines (none: not in history).
# Any benchmark's copy will do (they are one model by fingerprint); the newest commit that still
# held one is the parent of the commit that removed it, or HEAD if the tree still holds it.
history_files() {
  local spec=":(glob)results/*/start_models/$1/*" commit=HEAD gone files f
  git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1 || return 0
  files=$(model_files HEAD "$1")
  if [ -z "$files" ]; then
    gone=$(git -C "$REPO" log -1 --format=%H --diff-filter=D HEAD -- "$spec" 2>/dev/null || true)
    [ -n "$gone" ] || return 0
    commit="$gone^"
    files=$(model_files "$commit" "$1")
  fi
  [ -n "$files" ] || return 0
  while read -r f; do echo "$commit $f"; done <<<"$files"
}
# The files of one kept copy of start model SHA in COMMIT (ls-tree takes no glob pathspec).
model_files() {
  local dir
  dir=$(git -C "$REPO" ls-tree -r --name-only "$1" -- results 2>/dev/null | grep -m 1 "^results/[^/]*/start_models/$2/" || true)
  [ -z "$dir" ] || git -C "$REPO" ls-tree -r --name-only "$1" -- "$(dirname "$dir")/"
}
# Put start model SHA (full fingerprint FULL) back at PATH from git history; fails naming why.
restore_from_history() {
  local sha=$1 full=$2 path=$3 listing source commit file
  listing=$(history_files "$sha")
  source=${listing%% *}
  if [ -z "$listing" ]; then
    if [ "$(git -C "$REPO" rev-parse --is-shallow-repository 2>/dev/null)" = true ]; then
      echo "bench_results: start model $sha is kept in git history only, and this clone is shallow: run 'git fetch --unshallow' and restore again" >&2
    else
      echo "bench_results: start model $sha is neither in $results/start_models nor in the git history of $REPO (results/*/start_models/$sha)" >&2
    fi
    exit 2
  fi
  mkdir -p "$path"
  while read -r commit file; do
    git -C "$REPO" show "$commit:$file" >"$path/$(basename "$file")"
  done <<<"$listing"
  if [ "$(fingerprint "$path")" != "$full" ]; then
    echo "bench_results: the start model restored from git history ($source) at $path does not have fingerprint $full" >&2
    exit 2
  fi
  echo "bench_results: start model $sha put back at $path (from git history, $(git -C "$REPO" rev-parse --short "$source"))"
}

case "$mode" in
  save)
    [ -d "$bench" ] || { echo "bench_results: $bench does not exist" >&2; exit 2; }
    # Only finished runs: those with a wall.json beside them (written when a run ends).
    find "$bench" -name 'seed_*.wall.json' | while read -r wall; do
      run=${wall%.wall.json}
      rel=${run#"$bench"/}
      mkdir -p "$results/$rel"
      cp "$wall" "$results/$rel.wall.json"
      cp "$run/config.yaml" "$run/metrics.jsonl" "$results/$rel/"
    done
    # The start models the regimes recorded, once each, by fingerprint; none that git history keeps.
    for record in "$bench"/*/start_model.json; do
      [ -f "$record" ] || continue
      read -r path sha _ < <(record_fields "$record")
      if [ -n "$(history_files "$sha")" ]; then
        echo "bench_results: start model $sha is kept in git history; not copied"
      elif [ ! -d "$results/start_models/$sha" ]; then
        [ -f "$path/config.json" ] || { echo "bench_results: $record names $path, which holds no model" >&2; exit 2; }
        mkdir -p "$results/start_models/$sha"
        cp "$path"/* "$results/start_models/$sha/"
      fi
    done
    # A large validation set is kept as its SHA-256 only: the benchmark makes it again from its
    # seed when the runs are restored and refuses one that differs from the record
    # (benchmarks/strategies.py: write_validation_set). A small one is kept whole.
    for f in "$bench"/*/validation.jsonl; do
      [ -f "$f" ] || continue
      regime=$(basename "$(dirname "$f")")
      if [ "$(stat -c %s "$f")" -gt "$KEEP_VALIDATION_MAX_BYTES" ]; then
        mkdir -p "$results/$regime"
        sha256sum "$f" | cut -d' ' -f1 >"$results/$regime/validation.sha256"
        rm -f "$results/$regime/validation.jsonl" "$results/$regime/validation.jsonl.gz"
      else
        rm -f "$results/$regime/validation.sha256"
        mkdir -p "$results/$regime"
        cp "$f" "$results/$regime/validation.jsonl"
      fi
    done
    for f in "$bench"/*/success_rates.json "$bench"/*/start_model.json "$bench"/report.md "$bench"/summary.json "$bench"/*.png; do
      [ -f "$f" ] || continue
      mkdir -p "$results/$(dirname "${f#"$bench"/}")"
      cp "$f" "$results/${f#"$bench"/}"
    done
    # Every kept JSON-lines file compressed, deterministically (the same run saved twice: the same bytes).
    find "$results" -name '*.jsonl' -type f -print0 | xargs -0 -r env PYTHONPATH="$REPO" "$PYTHON" -m megatron_pc.jsonl compress
    # the report's summary.json without indentation, its plots in 256 colours (results/ stays under 10 MB)
    find "$results" -maxdepth 1 \( -name summary.json -o -name '*.png' \) -type f -print0 |
      xargs -0 -r env PYTHONPATH="$REPO" "$PYTHON" -m megatron_pc.analysis.kept
    echo "bench_results: finished runs of $bench kept in $results" ;;
  restore)
    [ -d "$results" ] || { echo "bench_results: $results does not exist" >&2; exit 2; }
    mkdir -p "$bench"
    for f in "$results"/*; do
      [ "$(basename "$f")" = start_models ] || cp -rn "$f" "$bench"/
    done
    # Back to plain JSON lines, as a run writes them (a file already there is kept, its copy dropped).
    find "$bench" -name '*.jsonl.gz' -type f -print0 | while IFS= read -r -d '' gz; do
      if [ -e "${gz%.gz}" ]; then rm -- "$gz"; else gzip -d -- "$gz"; fi
    done
    # Each recorded start model back where the runs' configs look for it, unless a model is there
    # already (the benchmark then refuses it if it is another one).
    for record in "$results"/*/start_model.json; do
      [ -f "$record" ] || continue
      read -r path sha full < <(record_fields "$record")
      [ ! -f "$path/config.json" ] || continue
      if [ -d "$results/start_models/$sha" ]; then
        mkdir -p "$path"
        cp "$results/start_models/$sha"/* "$path"/
        echo "bench_results: start model $sha put back at $path"
      else
        restore_from_history "$sha" "$full" "$path"
      fi
    done
    echo "bench_results: $results copied into $bench (existing files kept)" ;;
  *) echo "bench_results: unknown mode $mode (save or restore)" >&2; exit 2 ;;
esac
