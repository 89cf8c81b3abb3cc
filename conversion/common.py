"""Pieces both converters use: the architecture, the per-layer tensor groups, dist-checkpoint
ShardedTensors, a one-process group, and an output directory that appears only when complete."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from conversion.errors import ConversionError
from megatron_pc.errors import ConfigError
from megatron_pc.models import name_maps
from megatron_pc.models.hf_config import HFArch, load_arch

logger = logging.getLogger(__name__)

MARKER = "megatron_pc_checkpoint.json"  # same name as megatron_pc.training.checkpoint.MARKER
DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def read_arch(model_dir: Path) -> HFArch:
    """The architecture in ``model_dir/config.json``; unsupported ones name the supported ones."""
    try:
        return load_arch(model_dir)
    except ConfigError as err:
        raise ConversionError(f"{Path(model_dir) / 'config.json'}: {err}") from None


@dataclass(frozen=True)
class Item:
    """One Megatron tensor of the model: its map entry, layer, concrete name and checkpoint key."""

    entry: name_maps.Entry
    layer: int | None
    name: str
    key: str

    def hf_names(self) -> list[str]:
        """The HF tensors it is made of."""
        return [n.format(layer=self.layer) for n in self.entry.hf]


def groups(arch: HFArch) -> Iterator[list[Item]]:
    """The model's tensors in groups converted together: the embedding, each layer, the head.

    With tied embeddings the output layer is the embedding: it has no tensor of its own."""
    def item(entry: name_maps.Entry, layer: int | None) -> Item:
        name = entry.megatron.format(layer=layer)
        return Item(entry, layer, name, name_maps.checkpoint_key(name)[0])

    family = arch.family.name
    layer_entries = [e for e in name_maps.entries(family, arch.tie_embeddings) if "{layer}" in e.megatron]
    yield [item(name_maps.EMBEDDING, None)]
    for layer in range(arch.num_layers):
        yield [item(e, layer) for e in layer_entries]
    yield [item(name_maps.FINAL_NORM, None)] + ([] if arch.tie_embeddings else [item(name_maps.OUTPUT, None)])


def shapes_for(arch: HFArch, padded_vocab: int) -> name_maps.Shapes:
    """The layout facts of the name maps for a given padded vocabulary."""
    return name_maps.Shapes(arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.vocab_size, padded_vocab)


def full_shape(item: Item, arch: HFArch, shapes: name_maps.Shapes) -> tuple[int, ...]:
    """The full (TP=1) Megatron shape of ``item``."""
    return name_maps.megatron_shape(item.entry, shapes, arch.hidden_size, arch.intermediate_size)


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


def check_hf_weights(model_dir: Path) -> HFArch:
    """The architecture of ``model_dir``, after checking that every tensor its config implies
    is in the safetensors files with the implied shape. Only the headers are read, so a bad
    model directory is named in a second, before any worker starts."""
    from conversion.safetensors_io import HFReader

    arch = read_arch(model_dir)
    shapes = shapes_for(arch, arch.vocab_size)
    implied: set[str] = set()
    with HFReader(Path(model_dir)) as reader:
        for group in groups(arch):
            for item in group:
                meta = torch.empty(full_shape(item, arch, shapes), device="meta")
                for name, tensor in name_maps.hf_tensors(item.entry, item.layer, meta, shapes):
                    reader.check(name, tuple(tensor.shape))
                    implied.add(name)
        extra = sorted(n for n in reader.names() if n not in implied and not _ignorable(n, arch))
        if arch.tie_embeddings and "lm_head.weight" in reader.names() and not extra:
            embedding = "model.embed_tokens.weight"
            shape = (arch.vocab_size, arch.hidden_size)
            if not torch.equal(reader.get("lm_head.weight", shape), reader.get(embedding, shape)):
                raise ConversionError(f"{model_dir}: config.json says tie_word_embeddings but 'lm_head.weight' differs "
                                      f"from {embedding!r}: the head's weights would be dropped")  # fmt: skip
    if extra:
        raise ConversionError(f"{model_dir}: {len(extra)} tensor(s) the config does not imply, e.g. {extra[0]!r} "
                              f"(config.json says {arch.num_layers} layers): the config does not match the weights")
    return arch


def _ignorable(name: str, arch: HFArch) -> bool:
    """Tensors some checkpoints carry that no model weight comes from: rotary buffers, and
    the head of a model whose head is its embedding (checked to equal it)."""
    return name.endswith("rotary_emb.inv_freq") or (arch.tie_embeddings and name == "lm_head.weight")
