"""Checking a Hugging Face model directory against its config.json before any work starts:
the architecture, and every tensor the config implies present with the implied shape (headers
only). The model's tensors in conversion groups (:func:`groups`) are shared with the converters.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch

from megatron_pc.errors import ConfigError, ConversionError
from megatron_pc.models import name_maps
from megatron_pc.models.hf_config import HFArch, load_arch
from megatron_pc.models.safetensors_read import HFReader


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


def check_hf_weights(model_dir: Path) -> HFArch:
    """The architecture of ``model_dir``, after checking that every tensor its config implies
    is in the safetensors files with the implied shape. Only the headers are read, so a bad
    model directory is named in a second, before any worker starts."""
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
