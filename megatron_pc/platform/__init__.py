"""The only place that knows about CPU versus CUDA (see DESIGN.md, "CPU versus GPU").

torch is imported when a function needs it, not at import: :mod:`megatron_pc.platform.devices`
(which GPUs a job was given) also serves the launcher environment, which has no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_CPU_ADAPTER_NAMES = ("PATCHES", "apply_cpu_adapter", "cpu_adapter_active", "cpu_adapter_needed", "remove_cpu_adapter")

__all__ = [*_CPU_ADAPTER_NAMES, "on_gpu", "device", "device_name", "default_dtype", "dist_backend"]


def __getattr__(name: str) -> Any:
    """The CPU adapter's names, imported with torch on first use."""
    if name in _CPU_ADAPTER_NAMES:
        return getattr(importlib.import_module("megatron_pc.platform.cpu_adapter"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def on_gpu() -> bool:
    """Whether this process computes on a CUDA device (this Python's torch sees one)."""
    import torch

    return bool(torch.cuda.is_available())


def device() -> "torch.device":
    """The device this process computes on: the current CUDA device, else CPU."""
    import torch

    if on_gpu():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def device_name() -> str:
    """The name of the first CUDA device (as torch reports it, e.g. ``NVIDIA H200``), else ``CPU``."""
    import torch

    return torch.cuda.get_device_name(0) if on_gpu() else "CPU"


def default_dtype() -> "torch.dtype":
    """Parameter dtype for ``params_dtype: auto``: bf16 on GPU, fp32 on CPU."""
    import torch

    return torch.bfloat16 if on_gpu() else torch.float32


def dist_backend() -> str:
    """torch.distributed backend: NCCL on GPU, gloo on CPU."""
    return "nccl" if on_gpu() else "gloo"
