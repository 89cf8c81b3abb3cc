"""Fail fast on devices: GPUs the scheduler reports but this Python's torch cannot use (a CPU
build on a GPU node), or a layout that needs more GPUs than Ray has, stop the run before any
worker starts. This machine's torch is a CPU build, so the first case is real here."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from megatron_pc.driver.trainer import Trainer
from megatron_pc.errors import MegatronPCError
from megatron_pc.platform import devices
from standins import StandInWorkers
from test_trainer_loop import _cfg, _data

pytestmark = pytest.mark.skipif(devices.cuda_usable(), reason="checks the CPU build of torch")
SCHEDULER_VARS = ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS")


@pytest.mark.parametrize("env, count, source", [
    ({"CUDA_VISIBLE_DEVICES": "0,1,2,3"}, 4, "CUDA_VISIBLE_DEVICES=0,1,2,3"),
    ({"SLURM_GPUS_ON_NODE": "8"}, 8, "SLURM_GPUS_ON_NODE=8"),
    ({"SLURM_JOB_GPUS": "4,5"}, 2, "SLURM_JOB_GPUS=4,5"),
])  # fmt: skip
def test_scheduler_gpus_are_read_from_the_environment(env: dict, count: int, source: str) -> None:
    assert devices.scheduler_gpus(env, nvidia_smi=False) == devices.ReportedGpus(count, source)


@pytest.mark.parametrize("hidden", ["", "-1", "NoDevFiles"])
def test_a_cuda_visible_devices_that_hides_every_gpu_reports_none(hidden: str) -> None:
    assert devices.scheduler_gpus({"CUDA_VISIBLE_DEVICES": hidden, "SLURM_GPUS_ON_NODE": "8"}, nvidia_smi=False) is None


def test_no_gpus_reported_is_a_cpu_run() -> None:
    assert devices.use_gpus({}) is False


def test_gpus_reported_without_cuda_stop_train_before_any_worker_starts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in SCHEDULER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "8")
    made: list[StandInWorkers] = []
    with pytest.raises(MegatronPCError) as err:
        Trainer(_cfg(tmp_path, "grpo"), _data(tmp_path), lambda *a: made.append(StandInWorkers(*a)) or made[-1]).run()
    message = str(err.value)
    assert "SLURM_GPUS_ON_NODE=8 reports 8 GPU(s)" in message and f"the Python of {sys.prefix} cannot use CUDA" in message
    assert "bash scripts/install.sh --gpu" in message and "a CPU build" in message
    assert made == []  # refused before the workers were even made


def test_gpus_in_ray_without_cuda_are_refused() -> None:
    with pytest.raises(MegatronPCError, match=r"Ray reports 8 GPU\(s\), but the Python of .* cannot use CUDA"):
        devices.check_gpu_count(needed=8, ray_gpus=8, use_gpu=False)


def test_a_layout_needing_more_gpus_than_ray_has_is_refused() -> None:
    with pytest.raises(MegatronPCError, match=r"the layout needs 64 GPUs .* but the Ray cluster has 8"):
        devices.check_gpu_count(needed=64, ray_gpus=8, use_gpu=True)
    devices.check_gpu_count(needed=8, ray_gpus=8, use_gpu=True)  # enough: no error
    devices.check_gpu_count(needed=8, ray_gpus=0, use_gpu=False)  # a CPU run
