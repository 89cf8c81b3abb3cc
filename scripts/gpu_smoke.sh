#!/usr/bin/env bash
# The one-GPU smoke check (docs/gpu_smoke.md): every GPU test that needs neither vLLM nor Ray,
# on a machine with one GPU, Python 3.12 and torch but no megatron-core and no network.
#
#   scripts/gpu_smoke.sh --fetch     here, with network: download the wheels it carries into .whl/
#   scripts/gpu_smoke.sh --dry-run   here, on CPU: list the tests, check the wheels and the size
#   scripts/gpu_smoke.sh --list      the pytest node ids it runs, one a line
#   scripts/gpu_smoke.sh             on the GPU machine: install the wheels, run the tests, print
#                                    one JSON line (also written, with the pytest log, under $OUT)
#
# Environment: PYTHON (python3), MPC_SMOKE_WHEELS (the wheel folder, .whl), MPC_SMOKE_SITE (where
# the wheels are installed, /tmp/site), OUT (where results go, if set).
set -euo pipefail

REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PYTHON="${PYTHON:-python3}"
WHEEL_DIR="${MPC_SMOKE_WHEELS:-$REPO/.whl}"
SITE="${MPC_SMOKE_SITE:-/tmp/site}"
LIMIT_BYTES=$((64 * 1024 * 1024))  # what the device tool carries: the tree plus .whl, 64 MiB
MARGIN_BYTES=$((10 * 1024 * 1024)) # kept free under it, so a new file or wheel does not stop a device check
BUDGET_S=480                       # the whole pytest run; the brief is "under 8 minutes"
TEST_TIMEOUT_S=240                 # one hung test must not eat the budget of the others

# What the GPU machine lacks. Its own torch, numpy and packaging meet megatron-core's only
# requirements (torch>=2.6, numpy, packaging>=24.2); its transformers, safetensors, pyyaml,
# psutil and pytest serve the tests.
WHEELS=("megatron-core==0.16.1")
# pip matches each manylinux tag exactly: these are the tags the machine's pip accepts.
PLATFORM=(--only-binary=:all: --python-version 3.12 --implementation cp
          --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
          --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

# Every GPU test that needs no vLLM and no Ray and runs on one GPU. Left out: the NCCL broadcast
# and TP 2 with sequence parallelism (two GPUs), CUDA IPC into a vLLM engine (vLLM) and the
# pipelined run (two GPUs, vLLM, Ray).
# tests/unit/test_gpu_smoke.py checks each id exists and that nothing else in tests/gpu is missed.
SELECTION=(
  "tests/gpu/test_megatron_gpu.py::test_provider_uses_transformer_engine_spec_and_bf16_params_when_te_is_installed"
  "tests/gpu/test_megatron_gpu.py::test_provider_falls_back_to_our_sdpa_spec_without_transformer_engine"
  "tests/gpu/test_megatron_gpu.py::test_bf16_logprobs_match_transformers_bf16[llama]"
  "tests/gpu/test_megatron_gpu.py::test_bf16_logprobs_match_transformers_bf16[qwen2]"
  "tests/gpu/test_megatron_gpu.py::test_bf16_logprobs_match_transformers_bf16[qwen3]"
  "tests/gpu/test_megatron_gpu.py::test_bf16_train_step_keeps_fp32_main_params_and_moves_weights_toward_advantage"
  "tests/gpu/test_megatron_gpu.py::test_bf16_prompt_features_match_transformers_last_hidden_state"
  "tests/gpu/test_megatron_gpu.py::test_export_to_hf_names_and_back_is_bit_exact[llama-tied]"
  "tests/gpu/test_megatron_gpu.py::test_export_to_hf_names_and_back_is_bit_exact[qwen2]"
  "tests/gpu/test_megatron_gpu.py::test_export_to_hf_names_and_back_is_bit_exact[qwen3]"
  "tests/gpu/test_sequence_parallel_gpu.py::test_our_spec_in_bf16_on_cuda_equals_megatron_local_spec_and_trains"
  "tests/gpu/test_activations_gpu.py::test_our_spec_holds_the_modelled_bytes_a_token_at_14b_widths"
  "tests/gpu/test_activations_gpu.py::test_megatron_local_spec_holds_the_modelled_score_bytes"
  "tests/gpu/test_weight_sync_gpu.py::test_cuda_ipc_hands_buckets_to_another_process_on_the_same_gpu_bit_identical"
  "tests/gpu/test_weight_sync_gpu.py::test_cuda_ipc_sender_fails_naming_the_bucket_when_the_engine_never_acknowledges"
  "tests/gpu/test_weight_sync_gpu.py::test_cuda_ipc_per_gpu_bucket_reaches_the_worker_on_that_gpu_through_its_own_channel"
)

say() { echo "gpu_smoke: $*" >&2; }
die() { say "$*"; exit 1; }

# The wheel file of a NAME==VERSION spec in WHEEL_DIR (wheel names use _ for - in the name).
wheel_of() {
  local name="${1%%==*}" version="${1##*==}"
  local -a found=()
  shopt -s nullglob
  found=("$WHEEL_DIR/${name//-/_}-${version}-"*.whl)
  shopt -u nullglob
  [[ ${#found[@]} -eq 1 ]] && echo "${found[0]}"
}

# Fails naming every required wheel that is absent, and any distribution present twice (pip
# refuses to install two versions of one package in one call).
check_wheels() {
  local spec missing=() dist seen=" " dupes=() f
  for spec in "${WHEELS[@]}"; do
    wheel_of "$spec" >/dev/null || missing+=("$spec")
  done
  shopt -s nullglob
  for f in "$WHEEL_DIR"/*.whl; do
    dist="$(basename "$f")"; dist="${dist%%-*}"; dist="${dist,,}"
    [[ "$seen" == *" $dist "* ]] && dupes+=("$dist")
    seen+="$dist "
  done
  shopt -u nullglob
  [[ ${#dupes[@]} -eq 0 ]] || die "two wheels of ${dupes[*]} in $WHEEL_DIR: keep one version of each"
  [[ ${#missing[@]} -eq 0 ]] || die "missing wheel(s) in $WHEEL_DIR: ${missing[*]} (run scripts/gpu_smoke.sh --fetch)"
}

bytes_of_files() { xargs -0 -r stat -c %s -- 2>/dev/null | awk '{s += $1} END {print s + 0}'; }

# What the device tool sends: tracked and untracked-not-ignored files, plus the carried wheels. It
# must stay MARGIN_BYTES under the limit (results/ once took the tree to 58.6 MiB of 64).
check_size() {
  local tree wheels total
  git -C "$REPO" rev-parse --git-dir >/dev/null 2>&1 || die "$REPO is not a git checkout: cannot tell what travels"
  tree="$(cd "$REPO" && git ls-files -z --cached --others --exclude-standard | bytes_of_files)"
  wheels="$(find "$WHEEL_DIR" -type f -print0 2>/dev/null | bytes_of_files)"
  total=$((tree + wheels))
  say "what travels: tree $(mib "$tree") + wheels $(mib "$wheels") = $(mib "$total") of $(mib "$LIMIT_BYTES"); margin $(mib $((LIMIT_BYTES - total))) (at least $(mib "$MARGIN_BYTES"))"
  ((total <= LIMIT_BYTES)) || die "over the device's 64 MiB: $(mib "$total") (tree $(mib "$tree"), $WHEEL_DIR $(mib "$wheels"))"
  ((total <= LIMIT_BYTES - MARGIN_BYTES)) || die "less than $(mib "$MARGIN_BYTES") under the device's 64 MiB: $(mib "$total") (tree $(mib "$tree"), $WHEEL_DIR $(mib "$wheels")); keep large files out of the tree"
}

mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }

dry_run() {
  say "would run ${#SELECTION[@]} tests (pytest, ${BUDGET_S} s in all, ${TEST_TIMEOUT_S} s each):"
  printf '  %s\n' "${SELECTION[@]}" >&2
  check_wheels
  local spec
  for spec in "${WHEELS[@]}"; do say "carries $(basename "$(wheel_of "$spec")")"; done
  check_size
  say "dry run OK: on the GPU machine run scripts/gpu_smoke.sh with .whl carried"
}

fetch() {
  mkdir -p "$WHEEL_DIR"
  "$PYTHON" -m pip download -q --no-deps "${PLATFORM[@]}" -d "$WHEEL_DIR" "${WHEELS[@]}"
  dry_run
}

install_wheels() {
  local spec files=()
  for spec in "${WHEELS[@]}"; do files+=("$(wheel_of "$spec")"); done
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" "${files[@]}"
  export PYTHONPATH="$SITE:$REPO${PYTHONPATH:+:$PYTHONPATH}"
}

run_smoke() {
  check_wheels
  local results="${OUT:-$(mktemp -d)}" rc start
  mkdir -p "$results"
  install_wheels
  export MPC_GPU_FIGURES="$results/figures.jsonl" PYTHONUNBUFFERED=1
  : >"$MPC_GPU_FIGURES"
  cd "$REPO"
  start=$SECONDS
  set +e
  timeout --kill-after=20 "$BUDGET_S" "$PYTHON" -m pytest -v -p no:cacheprovider --timeout="$TEST_TIMEOUT_S" \
    --junitxml="$results/junit.xml" "${SELECTION[@]}" 2>&1 | tee "$results/pytest.log" >&2
  rc=${PIPESTATUS[0]}
  set -e
  say "pytest exit status $rc after $((SECONDS - start)) s; results in $results"
  # The last line on stdout: the JSON result.
  "$PYTHON" "$REPO/scripts/gpu_smoke_report.py" --junit "$results/junit.xml" --figures "$MPC_GPU_FIGURES" \
    --rc "$rc" --seconds "$((SECONDS - start))" --out "$results/gpu_smoke.json"
}

case "${1:-}" in
  --dry-run) dry_run ;;
  --fetch) fetch ;;
  --list) printf '%s\n' "${SELECTION[@]}" ;;
  "") run_smoke ;;
  *) die "unknown argument ${1} (use --dry-run, --fetch, --list or none)" ;;
esac
