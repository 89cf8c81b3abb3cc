"""slurm/bootstrap.sh on GPU nodes with a Python whose torch cannot use CUDA (this machine's CPU
build): the job stops after the plan and before Ray, naming the environment and the fix. Ray
and srun are recording stand-ins on PATH; the planner and the Python are real."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
VENV = REPO / ".venv"


@pytest.mark.skipif(not (VENV / "bin" / "megatron-pc").is_file(), reason="needs the project's .venv")
def test_gpu_job_with_a_cpu_torch_stops_before_ray_naming_the_venv_and_the_fix(tmp_path: Path) -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("this Python can use CUDA")
    spy = tmp_path / "bin"
    spy.mkdir()
    for name in ("ray", "srun"):
        (spy / name).write_text(f'#!/usr/bin/env bash\necho "{name} $*" >> "{tmp_path}/spy.log"\n')
        (spy / name).chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "CUDA_VISIBLE_DEVICES"}
    env.update(PATH=f"{spy}:{VENV / 'bin'}:{os.environ['PATH']}", MPC_VENV="", SLURM_JOB_ID="99", SLURM_JOB_NUM_NODES="1",
               SLURM_GPUS_ON_NODE="8", MPC_RUN_ROOT=str(tmp_path / "runs"), MPC_RAY_TMP=f"/tmp/mpc-gpuchk-{os.getpid()}",
               MPC_NO_DATA_CHECK="1")  # the paper config's data files are not in the checkout  # fmt: skip
    proc = subprocess.run(["bash", "slurm/bootstrap.sh", "configs/qwen2.5_math_1.5b.yaml"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert f"this job has 8 GPUs per node, but torch in {VENV} cannot use CUDA" in proc.stderr
    assert "bash scripts/install.sh --gpu" in proc.stderr
    assert "\nfits\n" in proc.stdout  # the plan ran first
    assert not (tmp_path / "spy.log").exists()  # no Ray, no srun
