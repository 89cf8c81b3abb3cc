"""Megatron distributed checkpoints (megatron.core.dist_checkpointing) of a worker: model,
optimizer, LR schedule, step and RNG. The model part reshards: a checkpoint saved at one
TP/PP loads at another. The optimizer part loads at any TP/PP when DP = 1 on both sides
(the non-distributed optimizer state is stored per parameter, like the model); RNG states
are restored only at the same layout (elsewhere they mean nothing).

Layout: ``DIR/config.json`` (the HF architecture, so ``score --load DIR`` can rebuild the
model) and Megatron's files in ``DIR`` itself.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

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
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    from megatron.core.tensor_parallel.random import get_cuda_rng_tracker

    torch.set_rng_state(state["torch"])
    get_cuda_rng_tracker().set_states(state["tracker"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _state(worker: Any, is_loading: bool, with_optimizer: bool) -> dict[str, Any]:
    model_sd = worker.module.sharded_state_dict()
    state: dict[str, Any] = {"model": model_sd}
    if with_optimizer:
        state["optimizer"] = worker.optimizer.sharded_state_dict(model_sd, is_loading=is_loading)
        state["scheduler"] = worker.scheduler.state_dict()
        state["step"] = worker.step
        state["layout"] = _layout()
    return state


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

    loaded = dist_checkpointing.load({"model": worker.module.sharded_state_dict()}, str(path))
    worker.module.load_state_dict(loaded["model"], strict=False)
    if hasattr(worker, "optimizer"):
        worker.optimizer.reload_model_params()


def load_checkpoint(worker: Any, path: str | Path) -> None:
    """Restore model, optimizer, schedule, step and (same layout only) RNG of a PolicyWorker."""
    from megatron.core import dist_checkpointing

    saved_layout = json.loads((Path(path) / MARKER).read_text())["layout"]
    state = _state(worker, is_loading=True, with_optimizer=True)
    same_layout = saved_layout == _layout()
    if same_layout:
        state["rng"] = _rng_object(None)
    loaded = dist_checkpointing.load(state, str(path))
    worker.module.load_state_dict(loaded["model"], strict=False)
    worker.optimizer.load_state_dict(loaded["optimizer"])
    worker.scheduler.load_state_dict(loaded["scheduler"])
    worker.step = int(loaded["step"])
    if same_layout:
        _set_rng_state(loaded["rng"])
    else:
        logger.warning("checkpoint layout %s differs from %s: RNG state not restored", saved_layout, _layout())
