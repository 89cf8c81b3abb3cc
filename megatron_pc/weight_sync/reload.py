"""Loading one bucket of HF weights into a vLLM worker's model, touching only the bucket's modules.

vLLM's ``Worker.reload_weights`` reloads the whole model: it puts EVERY module's tensors on the
meta device, loads the given weights, then restores every module that received none, logging
"<Layer>: Failed to load weights" for each of them and "Following weights were not loaded" with
the names of all the others. Called once per bucket, that is a pass over all of the model's
modules per bucket and, for a 40-layer model in 30 buckets, about 10^4 warning lines a worker a
sync. Here the same layer-wise reload (vLLM's ``initialize_layerwise_reload`` /
``finalize_layerwise_reload``) runs over the modules the bucket fills and no other: the pass is
as long as the bucket, and a module left out logs nothing because it was never taken apart.

Which modules a bucket fills: for each HF name, the deepest module of the vLLM model on its
path (``model.layers.3.self_attn`` for ``...self_attn.q_proj.weight``, which vLLM fuses into
``qkv_proj``), and under it every module that owns parameters. Modules with buffers only (the
rotary cache, computed from rope_theta) are left alone. A bucket must hold each such module's
weights whole (``buckets.buckets_by_layer`` keeps decoder layers whole): a fused module
processed with part of its weights would hold uninitialised memory.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch


def _deepest_module(model: torch.nn.Module, name: str) -> str:
    """The longest prefix of the parameter name ``name`` that names a module of ``model``."""
    parts = name.split(".")[:-1]
    while parts:
        try:
            model.get_submodule(".".join(parts))
            return ".".join(parts)
        except AttributeError:
            parts.pop()
    return ""


def modules_of(model: torch.nn.Module, names: Iterable[str]) -> list[torch.nn.Module]:
    """The modules of ``model`` that own parameters under the modules the HF ``names`` reach,
    each once, in model order."""
    prefixes = {_deepest_module(model, n) for n in names}
    chosen = []
    for path, module in model.named_modules():
        if not any(True for _ in module.parameters(recurse=False)):
            continue
        if any(p == "" or path == p or path.startswith(p + ".") for p in prefixes):
            chosen.append(module)
    return chosen


def reload_bucket(worker: Any, pairs: Sequence[tuple[str, torch.Tensor]]) -> None:
    """Load the HF-named full tensors ``pairs`` into ``worker``'s model in place (each worker
    keeps its TP shard), as vLLM's layer-wise reload does, over the bucket's modules only."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.reload import finalize_layerwise_reload, initialize_layerwise_reload

    runner = worker.model_runner
    model = runner.get_model()
    modules = modules_of(model, [name for name, _ in pairs])
    with set_current_vllm_config(worker.vllm_config), torch.no_grad():
        for module in modules:
            initialize_layerwise_reload(module)
        model.load_weights(iter(pairs))
        for module in modules:
            finalize_layerwise_reload(module, worker.vllm_config.model_config)
    for reset in ("reset_lora_state", "reset_encoder_cache", "reset_mm_cache"):  # as vLLM's reload does
        if hasattr(runner, reset):
            getattr(runner, reset)()
