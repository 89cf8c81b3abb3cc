"""The only place that knows about CPU versus CUDA (see DESIGN.md, "CPU versus GPU")."""

from __future__ import annotations

import torch

from megatron_pc.platform.cpu_adapter import (
    PATCHES,
    apply_cpu_adapter,
    cpu_adapter_active,
    cpu_adapter_needed,
    remove_cpu_adapter,
)

__all__ = [
    "PATCHES",
    "apply_cpu_adapter",
    "cpu_adapter_active",
    "cpu_adapter_needed",
    "remove_cpu_adapter",
    "device",
    "default_dtype",
    "dist_backend",
]


def device() -> torch.device:
    """The device this process computes on: the current CUDA device, else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def default_dtype() -> torch.dtype:
    """Parameter dtype for ``params_dtype: auto``: bf16 on GPU, fp32 on CPU."""
    return torch.bfloat16 if torch.cuda.is_available() else torch.float32


def dist_backend() -> str:
    """torch.distributed backend: NCCL on GPU, gloo on CPU."""
    return "nccl" if torch.cuda.is_available() else "gloo"
