"""The CPU adapter: lets Megatron-Core 0.16 run on CPU with gloo process groups.

Megatron-Core assumes CUDA in a few places. Each patch below names the Megatron call site
it serves; ``tests/unit/test_platform_cpu_adapter.py`` shows, per patch, that the
un-patched call raises on CPU. Nothing is patched at import time: the adapter is applied by
an explicit ``apply_cpu_adapter()`` and only when CUDA is absent, and can be removed again.

Two kinds of patch:

- *Global* (``torch.cuda.current_device`` and ``torch.cuda.synchronize``): called from
  dozens of Megatron forward/backward paths (``device=torch.cuda.current_device()`` in
  tensor_parallel/mappings.py, layers.py, the pipeline p2p code...). On a CPU build both raise
  "Torch not compiled with CUDA enabled". We replace them only when CUDA is absent.
- *Scoped*: a handful of Megatron functions hard-code ``device='cuda'``, call ``.cuda()`` or
  assert ``Tensor.type() == 'torch.cuda.FloatTensor'``. We wrap exactly those functions so
  that, while they run, a ``TorchFunctionMode`` maps the 'cuda' device to CPU and reports
  CPU tensor types under their CUDA names. Code outside them is untouched.
"""

from __future__ import annotations

import functools
import importlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

logger = logging.getLogger(__name__)


class CudaNamesOnCpu(TorchFunctionMode):
    """While active: ``device='cuda'`` means CPU, ``.cuda()`` is a no-op and ``.type()``
    names CPU tensors like CUDA ones (``torch.FloatTensor`` -> ``torch.cuda.FloatTensor``)."""

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name if ".cuda." in name else name.replace("torch.", "torch.cuda.", 1)
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == "cuda":
            kwargs["device"] = "cpu"
        return func(*args, **kwargs)


def _cpu_current_device() -> str:
    """Stand-in for ``torch.cuda.current_device``: the device tensors are made on."""
    return "cpu"


def _cpu_synchronize(device: Any = None) -> None:
    """Stand-in for ``torch.cuda.synchronize``: CPU ops are synchronous already."""


@dataclass(frozen=True)
class Patch:
    """One replaced attribute: ``module.attr`` (``attr`` may be ``Class.method``)."""

    module: str
    attr: str
    call_site: str
    """The Megatron call site that needs it (file:function, what it does)."""
    replacement: Callable[[Any], Any]
    """Maps the original attribute to its replacement."""


def _scoped(original: Any) -> Any:
    """Run ``original`` under ``CudaNamesOnCpu``; keeps static and class methods as such."""
    kind = type(original) if isinstance(original, (staticmethod, classmethod)) else None
    func = original.__func__ if kind else original

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        with CudaNamesOnCpu():
            return func(*args, **kwargs)

    return kind(wrapper) if kind else wrapper


PATCHES: tuple[Patch, ...] = (
    Patch("torch.cuda", "current_device",
          "tensor_parallel/mappings.py (_gather_along_*), layers.py, rotary_pos_embedding.py, "
          "pipeline_parallel/p2p_communication.py: device=torch.cuda.current_device()",
          lambda _: _cpu_current_device),
    Patch("torch.cuda", "synchronize",
          "pipeline_parallel/p2p_communication.py (_communicate, batch_p2p_sync) and "
          "dist_checkpointing: torch.cuda.synchronize()",
          lambda _: _cpu_synchronize),
    Patch("megatron.core.fusions.fused_softmax", "get_default_causal_mask",
          "transformer/utils.py:get_default_causal_mask (used by fused_softmax.forward_torch_softmax "
          "when no mask is passed): torch.ones(sq, sq, device='cuda')",
          _scoped),
    Patch("megatron.core.models.common.language_module.language_module",
          "LanguageModule.setup_embeddings_and_output_layer",
          "models/common/language_module/language_module.py:setup_embeddings_and_output_layer "
          "(tied embeddings with PP > 1): weight.data = weight.data.cuda()",
          _scoped),
    Patch("megatron.core.pipeline_parallel.schedules", "forward_backward_no_pipelining",
          "pipeline_parallel/schedules.py:forward_backward_no_pipelining: "
          "total_num_tokens = torch.zeros([], device='cuda')",
          _scoped),
    Patch("megatron.core.pipeline_parallel.schedules", "forward_backward_pipelining_without_interleaving",
          "pipeline_parallel/schedules.py:forward_backward_pipelining_without_interleaving: "
          "total_num_tokens = torch.zeros([], device='cuda')",
          _scoped),
    Patch("megatron.core.optimizer.optimizer", "FP32Optimizer.__init__",
          "optimizer/optimizer.py:FP32Optimizer.__init__: self._scale = torch.tensor(..., device='cuda')",
          _scoped),
    Patch("megatron.core.optimizer.optimizer", "MixedPrecisionOptimizer.__init__",
          "optimizer/optimizer.py:MixedPrecisionOptimizer.__init__ (base of DistributedOptimizer): "
          "found_inf / _scale_one = torch.tensor(..., device='cuda')",
          _scoped),
    Patch("megatron.core.optimizer.optimizer", "get_grad_norm_fp32",
          "optimizer/clip_grads.py:get_grad_norm_fp32: torch.zeros(..., device='cuda')",
          _scoped),
    Patch("megatron.core.optimizer.optimizer", "clip_grad_by_total_norm_fp32",
          "optimizer/clip_grads.py:clip_grad_by_total_norm_fp32: "
          "assert grad.type() == 'torch.cuda.FloatTensor'",
          _scoped),
    Patch("megatron.core.optimizer.distrib_optimizer", "DistributedOptimizer._build_model_and_main_param_groups",
          "optimizer/distrib_optimizer.py:_build_model_and_main_param_groups: "
          "model_param.type() must be a torch.cuda.*Tensor",
          _scoped),
)

_originals: dict[tuple[str, str], Any] = {}


def _owner_and_name(patch: Patch) -> tuple[Any, str]:
    owner: Any = importlib.import_module(patch.module)
    *path, name = patch.attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, name


def cpu_adapter_needed() -> bool:
    """True when CUDA is absent, i.e. when Megatron must be adapted to run on CPU."""
    return not torch.cuda.is_available()


def apply_cpu_adapter(force: bool = False) -> bool:
    """Apply every patch (idempotent). Does nothing when CUDA is present unless ``force``.

    Returns whether the adapter is active afterwards."""
    if not (force or cpu_adapter_needed()):
        return False
    for patch in PATCHES:
        key = (patch.module, patch.attr)
        if key in _originals:
            continue
        owner, name = _owner_and_name(patch)
        original = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        _originals[key] = original
        setattr(owner, name, patch.replacement(original))
    logger.debug("CPU adapter applied: %d patches", len(PATCHES))
    return True


def remove_cpu_adapter(only: str | None = None) -> None:
    """Restore the patched attributes: all, or only the patch whose ``attr`` is ``only``
    (tests restore one patch at a time to show it is needed)."""
    for patch in PATCHES:
        if only is not None and patch.attr != only:
            continue
        original = _originals.pop((patch.module, patch.attr), None)
        if original is not None:
            owner, name = _owner_and_name(patch)
            setattr(owner, name, original)


def cpu_adapter_active() -> bool:
    """Whether ``apply_cpu_adapter`` is in effect."""
    return bool(_originals)
