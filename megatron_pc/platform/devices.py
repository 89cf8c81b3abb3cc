"""Which GPUs this job was given, and whether this Python can use them.

A CPU build of torch on a GPU node runs silently: Ray still registers the node's GPUs, CUDA
reads as unavailable, and the run places CPU ranks of a model meant for GPUs. The checks here
compare what the scheduler (or Ray) reports with what torch can use and stop such a run before
any worker starts. Nothing here imports torch at module import: the launcher environment
(``.venv-launch``) has none.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from megatron_pc.errors import MegatronPCError

GPU_INSTALL_FIX = "bash scripts/install.sh --gpu"
"""The command that makes a GPU environment (docs/gpu_install.md)."""
_NO_DEVICES = ("", "-1", "none", "NoDevFiles")
"""CUDA_VISIBLE_DEVICES values that hide every GPU."""


@dataclass(frozen=True)
class ReportedGpus:
    """GPUs some authority says this job has."""

    count: int
    """How many."""
    source: str
    """Who says so, as a user can check it (``SLURM_GPUS_ON_NODE=8``, ``nvidia-smi``, ``Ray``)."""


def _count_list(value: str) -> int:
    return len([part for part in value.split(",") if part.strip()])


def scheduler_gpus(env: Mapping[str, str] | None = None, nvidia_smi: bool = True) -> ReportedGpus | None:
    """GPUs the scheduler gave this node, or None when nothing reports any.

    Asked in order: ``CUDA_VISIBLE_DEVICES`` (set by SLURM's GRES plugin and by Ray), SLURM's
    ``SLURM_GPUS_ON_NODE`` and ``SLURM_JOB_GPUS``, then ``nvidia-smi -L`` (when ``nvidia_smi``
    and it is on PATH). A ``CUDA_VISIBLE_DEVICES`` that hides every GPU means none.
    """
    env = os.environ if env is None else env
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        if visible.strip() in _NO_DEVICES:
            return None
        return ReportedGpus(_count_list(visible), f"CUDA_VISIBLE_DEVICES={visible}")
    on_node = env.get("SLURM_GPUS_ON_NODE", "").strip()
    if on_node.isdigit() and int(on_node) > 0:
        return ReportedGpus(int(on_node), f"SLURM_GPUS_ON_NODE={on_node}")
    job_gpus = env.get("SLURM_JOB_GPUS", "").strip()
    if job_gpus:
        return ReportedGpus(_count_list(job_gpus), f"SLURM_JOB_GPUS={job_gpus}")
    if nvidia_smi and (smi := shutil.which("nvidia-smi")):
        try:
            out = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            return None
        gpus = [line for line in out.splitlines() if line.startswith("GPU ")]
        if gpus:
            return ReportedGpus(len(gpus), "nvidia-smi -L")
    return None


def cuda_usable() -> bool:
    """True when this Python's torch can run CUDA (False without torch)."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def _no_cuda_error(reported: ReportedGpus) -> MegatronPCError:
    try:
        import torch

        build = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a CPU build")
    except ImportError:
        build = "no torch"
    return MegatronPCError(
        f"{reported.source} reports {reported.count} GPU(s), but the Python of {sys.prefix} cannot use CUDA ({build}); "
        f"the run would place CPU workers of a GPU job. Make a GPU environment with `{GPU_INSTALL_FIX}` and run from it "
        f"(MPC_VENV=<that venv> for slurm/bootstrap.sh), or hide the GPUs (CUDA_VISIBLE_DEVICES=) for a CPU run"
    )


def use_gpus(env: Mapping[str, str] | None = None) -> bool:
    """Whether this run computes on GPUs: True when CUDA is usable. Raises
    :class:`MegatronPCError` naming the environment and the fix when the scheduler reports
    GPUs that CUDA cannot use (a CPU build of torch on a GPU node)."""
    if cuda_usable():
        return True
    reported = scheduler_gpus(env)
    if reported is not None and reported.count > 0:
        raise _no_cuda_error(reported)
    return False


def check_gpu_count(needed: int, ray_gpus: float, use_gpu: bool) -> None:
    """Refuse a run whose devices do not match: Ray registered GPUs but this Python cannot use
    CUDA, or the layout needs more GPUs (``needed``) than the Ray cluster has."""
    if ray_gpus > 0 and not use_gpu:
        raise _no_cuda_error(ReportedGpus(int(ray_gpus), "Ray"))
    if use_gpu and needed > ray_gpus:
        raise MegatronPCError(
            f"the layout needs {needed} GPUs (policy TP x PP x DP and rollout.engines x rollout.tensor_parallel; "
            f"`megatron-pc plan` shows them), but the Ray cluster has {ray_gpus:g}: lower cluster.data_parallel or "
            "rollout.engines, or ask the scheduler for more GPUs"
        )
