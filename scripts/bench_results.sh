#!/usr/bin/env bash
# Keep the finished runs of `megatron-pc bench rollouts` without their checkpoints and traces, to
# commit and share them, and put them back so a later benchmark call reuses them (a run whose
# metrics reach --steps counts as finished; docs/benchmarks.md), with the start model each regime
# recorded (REGIME/start_model.json), so a later machine trains further runs from the same bits.
#   scripts/bench_results.sh save    [BENCH_DIR] [RESULTS_DIR]   # runs/bench_rollouts -> results/bench_rollouts
#   scripts/bench_results.sh restore [BENCH_DIR] [RESULTS_DIR]   # results/bench_rollouts -> runs/bench_rollouts
set -euo pipefail
mode=${1:?usage: scripts/bench_results.sh save|restore [BENCH_DIR] [RESULTS_DIR]}
bench=${2:-runs/bench_rollouts}
results=${3:-results/bench_rollouts}
# A start-model record's model path and the first 12 hex digits of its fingerprint.
record_fields() {
  python3 -c 'import json, sys; r = json.load(open(sys.argv[1])); print(r["path"], r["sha256"][:12])' "$1"
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
    # The start models the regimes recorded, once each, by fingerprint.
    for record in "$bench"/*/start_model.json; do
      [ -f "$record" ] || continue
      read -r path sha < <(record_fields "$record")
      if [ ! -d "$results/start_models/$sha" ]; then
        [ -f "$path/config.json" ] || { echo "bench_results: $record names $path, which holds no model" >&2; exit 2; }
        mkdir -p "$results/start_models/$sha"
        cp "$path"/* "$results/start_models/$sha/"
      fi
    done
    for f in "$bench"/*/validation.jsonl "$bench"/*/success_rates.json "$bench"/*/start_model.json "$bench"/report.md "$bench"/summary.json "$bench"/*.png; do
      [ -f "$f" ] || continue
      mkdir -p "$results/$(dirname "${f#"$bench"/}")"
      cp "$f" "$results/${f#"$bench"/}"
    done
    echo "bench_results: finished runs of $bench kept in $results" ;;
  restore)
    [ -d "$results" ] || { echo "bench_results: $results does not exist" >&2; exit 2; }
    mkdir -p "$bench"
    for f in "$results"/*; do
      [ "$(basename "$f")" = start_models ] || cp -rn "$f" "$bench"/
    done
    # Each recorded start model back where the runs' configs look for it, unless a model is there
    # already (the benchmark then refuses it if it is another one).
    for record in "$results"/*/start_model.json; do
      [ -f "$record" ] || continue
      read -r path sha < <(record_fields "$record")
      if [ ! -f "$path/config.json" ] && [ -d "$results/start_models/$sha" ]; then
        mkdir -p "$path"
        cp "$results/start_models/$sha"/* "$path"/
        echo "bench_results: start model $sha put back at $path"
      fi
    done
    echo "bench_results: $results copied into $bench (existing files kept)" ;;
  *) echo "bench_results: unknown mode $mode (save or restore)" >&2; exit 2 ;;
esac
