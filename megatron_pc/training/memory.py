"""What a colocated policy rank gives back to the device before the engines wake, and takes
again before the next update (``PolicyWorker.offload_for_generation`` / ``reload_for_training``).

Generation needs the policy's bf16 weights (the weight sync reads them, the sync check runs a
forward pass) but not its fp32 gradient buffer nor Adam's state. Without this, the caching
allocator keeps the update's peak reserved and vLLM's ``gpu_memory_utilization`` share of the
device does not fit beside it (megatron-pc plan counts both).

- gradients: Megatron DDP's ``offload_grad_buffers`` frees the storage of the fp32 grad buffer
  (the views stay valid objects); ``restore_grad_buffers`` reallocates it zeroed. Nothing is
  copied: an update zeroes the buffer before its first micro-batch anyway.
- optimizer state: Megatron's ``offload_to_cpu`` / ``restore_from_cpu`` move the fp32 master
  weights and moments to host memory and back.
- the allocator cache: ``torch.cuda.empty_cache`` returns free blocks to the driver.

On CPU every step is a no-op (nothing is on a device); the bookkeeping still runs, so the
order of calls is checked by the CPU tests.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from megatron_pc import platform
from megatron_pc.training.config import MemorySettings

logger = logging.getLogger(__name__)
GB = 1e9


def _reserved_gb() -> float:
    return torch.cuda.memory_reserved() / GB if platform.on_gpu() else 0.0


def _optimizer_owns_model_params(worker: Any) -> bool:
    """True when the optimizer steps the model's own tensors (fp32 parameters: no master
    copy), whose move to host would take the weights away from generation. The distributed
    optimizer steps slices of them (views of the same storage), so storages are compared."""
    model_storage = {p.untyped_storage().data_ptr() for p in worker.module.parameters()}
    optimizers = getattr(worker.optimizer, "chained_optimizers", [worker.optimizer])
    return any(p.untyped_storage().data_ptr() in model_storage
               for opt in optimizers for group in opt.optimizer.param_groups for p in group["params"])  # fmt: skip


def offload_for_generation(worker: Any, settings: MemorySettings) -> dict[str, float]:
    """Free or move what ``settings`` says; records what is away on ``worker._offloaded``.
    Returns {"reserved_before_gb", "reserved_after_gb"} of this device."""
    before = _reserved_gb()
    on_gpu = platform.on_gpu()
    if on_gpu:
        torch.cuda.synchronize()
    if settings.offload_grads and "grads" not in worker._offloaded:
        if on_gpu:
            worker.model.offload_grad_buffers(synchronize=False, empty_cache=False)
        worker._offloaded["grads"] = True
    if settings.offload_optimizer and "optimizer" not in worker._offloaded:
        if _optimizer_owns_model_params(worker):
            logger.debug("offload_optimizer skipped: fp32 parameters are the optimizer's own (no master copy)")
        else:
            if on_gpu:
                worker.optimizer.offload_to_cpu()
            worker._offloaded["optimizer"] = True
    if settings.empty_cache and on_gpu:
        torch.cuda.empty_cache()
    after = _reserved_gb()
    logger.info("before generation: %.1f GB reserved -> %.1f GB (%s away)", before, after, ", ".join(worker._offloaded) or "nothing")
    return {"reserved_before_gb": before, "reserved_after_gb": after}


def reload_for_training(worker: Any) -> None:
    """Bring back what :func:`offload_for_generation` took; nothing when nothing is away."""
    on_gpu = platform.on_gpu()
    if worker._offloaded.pop("grads", False) and on_gpu:
        worker.model.restore_grad_buffers(synchronize=False)
    if worker._offloaded.pop("optimizer", False) and on_gpu:
        worker.optimizer.restore_from_cpu()
    if on_gpu:
        torch.cuda.synchronize()
