"""Pieces both converters use: dist-checkpoint ShardedTensors, a one-process group, and an output
directory that appears only when complete. (The architecture, the per-layer tensor groups and
the HF-weights check are ``megatron_pc/models/hf_check.py``: the product checks a model with them.)"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

from megatron_pc.errors import ConversionError
from megatron_pc.models import name_maps
from megatron_pc.models.hf_check import Item
from megatron_pc.models.hf_config import HFArch

logger = logging.getLogger(__name__)

MARKER = "megatron_pc_checkpoint.json"  # same name as megatron_pc.training.checkpoint.MARKER
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def sharded_tensor(item: Item, data: torch.Tensor, num_layers: int):  # -> ShardedTensor
    """``data`` (a full tensor; one layer's slice for layer tensors) as a ShardedTensor of
    the checkpoint, laid out as Megatron's own ``sharded_state_dict`` lays it out."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    if item.layer is None:
        return ShardedTensor.from_rank_offsets(item.key, data, replica_id=0)
    return ShardedTensor.from_rank_offsets(item.key, data, (0, item.layer, num_layers), replica_id=0,
                                           prepend_axis_num=1)


@contextmanager
def process_group() -> Iterator[None]:
    """A one-process gloo group (dist_checkpointing needs torch.distributed); reuses an
    existing one."""
    import torch.distributed as dist

    from megatron_pc import platform

    platform.apply_cpu_adapter()  # dist_checkpointing calls torch.cuda.synchronize()
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


@contextmanager
def output_dir(out: Path, force: bool) -> Iterator[Path]:
    """A temporary directory next to ``out``, renamed to ``out`` only if the body succeeds;
    on failure nothing is left behind and an existing ``out`` is untouched."""
    out = Path(out)
    if out.exists() and not force:
        raise ConversionError(f"{out} already exists; pass --force to replace it")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out) if out.is_dir() else out.unlink()
        os.replace(tmp, out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


_WEIGHT_SUFFIXES = (".safetensors", ".distcp", ".bin", ".pt", ".pth", ".gguf")
_CHECKPOINT_FILES = {"model.safetensors.index.json", ".metadata", "metadata.json", MARKER}


def copy_model_files(source: Path, dest: Path) -> list[str]:
    """Copy config, tokenizer and generation config (every plain file that is not weights or
    Megatron checkpoint data) from ``source`` to ``dest``; returns the names copied."""
    copied = []
    for path in sorted(Path(source).iterdir()):
        if not path.is_file() or path.name in _CHECKPOINT_FILES or path.name.endswith(_WEIGHT_SUFFIXES):
            continue
        shutil.copy(path, dest / path.name)
        copied.append(path.name)
    return copied


def extra_state_objects(arch: HFArch) -> dict:
    """The ``_extra_state`` entries Megatron's linear layers put in a checkpoint (None for
    the local spec; Transformer Engine keeps FP8 metadata there and accepts None). Loading
    fails on a missing key, so a converted checkpoint carries them like a saved one."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    family = arch.family.name
    linears = sorted({e.megatron.rsplit(".", 1)[0] for e in name_maps.entries(family, arch.tie_embeddings)
                      if "{layer}" in e.megatron and e.megatron.rsplit(".", 2)[-2].startswith("linear_")})
    objects = {}
    for layer in range(arch.num_layers):
        for module in linears:
            key = name_maps.checkpoint_key(module.format(layer=layer) + "._extra_state")[0]
            objects[f"{module.format(layer=layer)}._extra_state"] = ShardedObject(
                key, None, (arch.num_layers,), (layer,), replica_id=0)
    return objects


#END
