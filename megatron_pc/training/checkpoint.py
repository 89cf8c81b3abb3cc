"""Megatron distributed checkpoints (megatron.core.dist_checkpointing) of a worker: model,
optimizer, LR schedule, step and RNG. The model part reshards: a checkpoint saved at one
TP/PP loads at another. The optimizer (Megatron's distributed optimizer at every DP) is
stored per parameter in the model's shape (:data:`OPTIMIZER_FORMAT`), so it loads at another
DP: a run saved at DP 2 resumes at DP 1 and the other way round. RNG states are restored only
at the same layout (elsewhere they mean nothing).

Layout: ``DIR/config.json`` (the HF architecture, so ``score --load DIR`` can rebuild the
model) and Megatron's files in ``DIR`` itself.

Loading is strict: a key the model asks for that the checkpoint lacks (missing), or a key of
the checkpoint that the model does not ask for (unexpected), stops the load with
:class:`CheckpointMismatchError` naming every such key. A checkpoint of another architecture
(a bias, a norm, a renamed layer) would otherwise resume with freshly initialised tensors in
silence. Only the keys of :data:`ALLOWED_MISMATCH` may differ.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from megatron_pc import platform
from megatron_pc.errors import MegatronPCError

logger = logging.getLogger(__name__)

ALLOWED_MISMATCH: dict[str, str] = {
    "*._extra_state": "Transformer Engine layers keep FP8 metadata in ``_extra_state`` and local "
                      "(non-TE) layers keep none: a checkpoint written by one build loads in the other",
    "*._extra_state/*": "the same extra state, stored as one object per shard",
    "rng_state*": "RNG states are restored at the same layout only (elsewhere they mean nothing)",
}
"""fnmatch pattern of a key that may be missing or unexpected -> why. Anything else refuses."""
MODEL_ONLY_IGNORED = ("optimizer.*", "optimizer/*", "rng_state*")
"""Checkpoint keys that are not the model's (the optimizer's and the RNG's): the model's keys
are compared without them."""


class CheckpointMismatchError(MegatronPCError, RuntimeError):
    """The checkpoint's keys and the model's differ beyond :data:`ALLOWED_MISMATCH`."""


def _refused(keys: set[str] | list[str]) -> list[str]:
    return sorted(k for k in keys if not any(fnmatch.fnmatchcase(k, p) for p in ALLOWED_MISMATCH))


def check_keys(path: str | Path, missing: set[str] | list[str], unexpected: set[str] | list[str]) -> None:
    """Raise :class:`CheckpointMismatchError` naming the keys that are missing from the
    checkpoint at ``path`` or unexpected in it, except the allowed ones."""
    bad_missing, bad_unexpected = _refused(missing), _refused(unexpected)
    if not bad_missing and not bad_unexpected:
        return
    parts = []
    if bad_missing:
        parts.append(f"missing from the checkpoint (the model has them): {', '.join(bad_missing)}")
    if bad_unexpected:
        parts.append(f"unexpected in the checkpoint (the model has no such key): {', '.join(bad_unexpected)}")
    raise CheckpointMismatchError(
        f"checkpoint {path} does not match the model ({len(bad_missing)} keys missing, {len(bad_unexpected)} "
        f"unexpected): " + "; ".join(parts)
        + ". Resume with the architecture it was saved from (its config.json), or start a new run."
    )


def _model_keys(worker: Any) -> set[str]:
    """The sharded keys the model asks a checkpoint for (factories expanded, as a load does)."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedBase, apply_factories

    fresh = worker.module.sharded_state_dict()  # views of the weights: nothing is copied
    apply_factories(fresh)
    return {v.key for v in nested_values(fresh) if isinstance(v, ShardedBase)}


def check_model_keys(worker: Any, path: str | Path) -> None:
    """Compare the model's sharded keys with the checkpoint's model keys before anything is
    read (Megatron's own non-strict load drops the model's missing keys and then fails deep in
    the optimizer's state with no name). The optimizer's keys follow the model's parameters,
    so a model that matches has an optimizer state that matches."""
    from megatron.core.dist_checkpointing.serialization import load_sharded_metadata

    in_checkpoint = {k for k in load_sharded_metadata(str(path))
                     if not any(fnmatch.fnmatchcase(k, p) for p in MODEL_ONLY_IGNORED)}
    wanted = _model_keys(worker)
    # A pipeline stage asks for its own layers only: a key is unexpected when no rank asks for it.
    every: list[set[str]] = [set() for _ in range(dist.get_world_size())]
    dist.all_gather_object(every, wanted)
    check_keys(path, wanted - in_checkpoint, in_checkpoint - set().union(*every))


def _load_module(worker: Any, model_state: dict[str, Any], path: str | Path) -> None:
    """Copy the loaded tensors into the module, refusing any state-dict key left over."""
    result = worker.module.load_state_dict(model_state, strict=False)
    check_keys(path, result.missing_keys, result.unexpected_keys)


MARKER = "megatron_pc_checkpoint.json"


def is_checkpoint(path: str | Path) -> bool:
    """Whether ``path`` is a checkpoint written by ``save_checkpoint``."""
    return (Path(path) / MARKER).is_file()


def _layout() -> list[int]:
    from megatron.core import parallel_state as ps

    return [ps.get_tensor_model_parallel_world_size(), ps.get_pipeline_model_parallel_world_size(),
            ps.get_data_parallel_world_size()]


def _rng_object(data: Any) -> Any:
    """This rank's RNG state as a ShardedObject, one per (PP, TP, DP) position."""
    from megatron.core import parallel_state as ps
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    tp, pp, dp = _layout()
    offset = (ps.get_pipeline_model_parallel_rank(), ps.get_tensor_model_parallel_rank(), ps.get_data_parallel_rank())
    return ShardedObject("rng_state", data, (pp, tp, dp), offset, replica_id=0)


def _rng_state() -> dict[str, Any]:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    state = {"torch": torch.get_rng_state(), "tracker": get_cuda_rng_tracker().get_states()}
    if platform.on_gpu():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    torch.set_rng_state(state["torch"])
    get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state and platform.on_gpu():
        torch.cuda.set_rng_state(state["cuda"])


def _prime_torch_adam(optimizer: Any) -> None:
    """Give a fresh torch Adam (the CPU path: no Apex, no TE) zero moments and step 0, what its
    first update would create. The distributed optimizer's state dict reads the step out of the
    Adam state, which a fresh optimizer lacks (``assert len(steps) == 1`` in
    ``DistributedOptimizer.state_dict``): for a load, which then overwrites all of it, and for a
    save before the first update."""
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = opt.optimizer
        if not isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            continue
        for group in inner.param_groups:
            for param in group["params"]:
                if not inner.state[param]:
                    inner.state[param].update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(param),
                                              exp_avg_sq=torch.zeros_like(param))


def _load_optimizer(optimizer: Any, state: Any) -> None:
    """Load the distributed optimizer's state: its schedule-free part, then each parameter's
    share of the ``fully_reshardable`` tensors. Megatron-Core 0.16 loads the second into every
    key of the Adam state, which torch Adam's ``step`` (put there by the first) is not among
    (``KeyError: 'step'``): the step is set aside around it. The first also gives every
    parameter the same step tensor, which torch Adam's foreach update then increments once per
    parameter (step 18 after one update of a 17-tensor model): each gets its own copy."""
    chained = getattr(optimizer, "chained_optimizers", [optimizer])
    states = [state] if len(chained) == 1 else [v for _, v in sorted(state.items())]
    for opt, part in zip(chained, states):
        param_state = part.pop("param_state")
        part.pop("param_state_sharding_type")
        opt.load_state_dict(part)
        inner = opt.optimizer.state
        steps = {param: inner[param].pop("step") for param in list(inner) if "step" in inner[param]}
        try:
            opt.load_parameter_state_from_fully_reshardable(param_state)
        finally:
            for param, step in steps.items():
                inner[param]["step"] = step.clone()


def _state(worker: Any, is_loading: bool, with_optimizer: bool) -> dict[str, Any]:
    model_sd = worker.module.sharded_state_dict()
    if with_optimizer:
        # Loading: the state to load into. Saving before the first update (a step whose train
        # batch was empty): the state a first update would create, zero moments at step 0.
        _prime_torch_adam(worker.optimizer)
    state: dict[str, Any] = {"model": model_sd}
    if with_optimizer:
        state["optimizer"] = worker.optimizer.sharded_state_dict(model_sd, is_loading=is_loading, metadata=OPTIMIZER_FORMAT)
        state["scheduler"] = worker.scheduler.state_dict()
        state["step"] = worker.step
        state["layout"] = _layout()
    return state


OPTIMIZER_FORMAT = {"distrib_optim_sharding_type": "fully_reshardable",
                    "distrib_optim_fully_reshardable_mem_efficient": True}
"""How the distributed optimizer writes its state: ``fully_reshardable`` gathers each
parameter's master weight and Adam moments on DP rank 0 (over gloo, ``mem_efficient``) and
stores them in the model's own shape and sharding, so a checkpoint loads at another DP (and
the load slices each rank's share). Megatron-Core 0.16's default (``fully_sharded_model_space``)
cannot even save on CPU ("ShardedTensor.flattened_range is not supported")."""


HF_METADATA_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
    "chat_template.jinja",
)
"""Hugging Face files copied into a checkpoint so that it is self-describing."""


def save_checkpoint(worker: Any, path: str | Path) -> None:
    """Save ``worker`` (a PolicyWorker) collectively: every rank must call it."""
    from megatron.core import dist_checkpointing

    path = Path(path)
    if dist.get_rank() == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    state = _state(worker, is_loading=False, with_optimizer=True)
    state["rng"] = _rng_object(_rng_state())
    dist_checkpointing.save(state, str(path))
    if dist.get_rank() == 0:
        # config.json rebuilds the model; tokenizer files let ``score --load`` read it alone.
        # Only these: model.path may itself be a checkpoint, whose own files must not be copied.
        for name in HF_METADATA_FILES:
            source = Path(worker.model_cfg.path) / name
            if source.is_file():
                shutil.copy(source, path / name)
        (path / MARKER).write_text(json.dumps({"step": worker.step, "layout": _layout()}))
    dist.barrier()
    logger.info("saved checkpoint step %d to %s", worker.step, path)


def load_model_only(worker: Any, path: str | Path) -> None:
    """Load only the model weights (reference worker, scoring), at any TP/PP."""
    from megatron.core import dist_checkpointing

    check_model_keys(worker, path)
    loaded = dist_checkpointing.load({"model": worker.module.sharded_state_dict()}, str(path))
    _load_module(worker, loaded["model"], path)
    if hasattr(worker, "optimizer"):
        worker.optimizer.reload_model_params()


def load_checkpoint(worker: Any, path: str | Path) -> None:
    """Restore model, optimizer, schedule, step and (same layout only) RNG of a PolicyWorker."""
    from megatron.core import dist_checkpointing

    check_model_keys(worker, path)
    saved_layout = json.loads((Path(path) / MARKER).read_text())["layout"]
    state = _state(worker, is_loading=True, with_optimizer=True)
    same_layout = saved_layout == _layout()
    if same_layout:
        state["rng"] = _rng_object(None)
    loaded = dist_checkpointing.load(state, str(path))
    _load_module(worker, loaded["model"], path)
    _load_optimizer(worker.optimizer, loaded["optimizer"])
    worker.scheduler.load_state_dict(loaded["scheduler"])
    worker.step = int(loaded["step"])
    if same_layout:
        _set_rng_state(loaded["rng"])
    else:
        logger.warning("checkpoint layout %s differs from %s: RNG state not restored", saved_layout, _layout())
