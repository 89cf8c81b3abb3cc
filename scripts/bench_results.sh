#!/usr/bin/env bash
# Keep the finished runs of `megatron-pc bench rollouts` without their checkpoints and traces, to
# commit and share them, and put them back so a later benchmark call reuses them (a run whose
# metrics reach --steps counts as finished; docs/benchmarks.md).
#   scripts/bench_results.sh save    [BENCH_DIR] [RESULTS_DIR]   # runs/bench_rollouts -> results/bench_rollouts
#   scripts/bench_results.sh restore [BENCH_DIR] [RESULTS_DIR]   # results/bench_rollouts -> runs/bench_rollouts
set -euo pipefail
mode=${1:?usage: scripts/bench_results.sh save|restore [BENCH_DIR] [RESULTS_DIR]}
bench=${2:-runs/bench_rollouts}
results=${3:-results/bench_rollouts}
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
    for f in "$bench"/*/validation.jsonl "$bench"/*/success_rates.json "$bench"/report.md "$bench"/summary.json "$bench"/*.png; do
      [ -f "$f" ] || continue
      mkdir -p "$results/$(dirname "${f#"$bench"/}")"
      cp "$f" "$results/${f#"$bench"/}"
    done
    echo "bench_results: finished runs of $bench kept in $results" ;;
  restore)
    [ -d "$results" ] || { echo "bench_results: $results does not exist" >&2; exit 2; }
    mkdir -p "$bench"
    cp -rn "$results"/. "$bench"/
    echo "bench_results: $results copied into $bench (existing files kept)" ;;
  *) echo "bench_results: unknown mode $mode (save or restore)" >&2; exit 2 ;;
esac
