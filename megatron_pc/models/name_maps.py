"""HF <-> Megatron parameter names and layouts: one declarative map per model family.

The single source of truth for the HF loader here, the conversion tool and the weight sync
to vLLM. Megatron names are those of Megatron's *local* layer spec (``TE_ALIASES`` maps the
Transformer Engine spec's names onto them); ``{layer}`` is the global layer index.

Full Megatron tensors are in the TP=1 layout:
- ``linear_qkv`` (weight and bias) is grouped per KV head: [q heads of group g, k_g, v_g]
  for g = 0..groups-1, so TP shards are contiguous row blocks.
- ``linear_fc1`` is [gate; up]; a TP shard r is [gate_r; up_r] (see ``shard``).
- embedding / output rows are padded with zeros to the padded vocab size.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from megatron_pc.errors import ConfigError


@dataclass(frozen=True)
class Entry:
    """One Megatron tensor and the HF tensor(s) it is made of."""

    megatron: str
    hf: tuple[str, ...]
    fuse: str = "copy"
    """copy (one HF tensor), qkv (q, k, v -> grouped QKV) or gate_up (gate, up -> fc1)."""
    tp_dim: int | None = None
    """The dimension split over tensor-parallel ranks; None: replicated."""
    vocab: bool = False
    """Rows are vocabulary entries, padded with zeros in Megatron."""


_M = "decoder.layers.{layer}."
_H = "model.layers.{layer}."

LLAMA_LAYER: tuple[Entry, ...] = (
    Entry(_M + "input_layernorm.weight", (_H + "input_layernorm.weight",)),
    Entry(_M + "self_attention.linear_qkv.weight",
          (_H + "self_attn.q_proj.weight", _H + "self_attn.k_proj.weight", _H + "self_attn.v_proj.weight"),
          fuse="qkv", tp_dim=0),
    Entry(_M + "self_attention.linear_proj.weight", (_H + "self_attn.o_proj.weight",), tp_dim=1),
    Entry(_M + "pre_mlp_layernorm.weight", (_H + "post_attention_layernorm.weight",)),
    Entry(_M + "mlp.linear_fc1.weight", (_H + "mlp.gate_proj.weight", _H + "mlp.up_proj.weight"),
          fuse="gate_up", tp_dim=0),
    Entry(_M + "mlp.linear_fc2.weight", (_H + "mlp.down_proj.weight",), tp_dim=1),
)
QWEN2_LAYER: tuple[Entry, ...] = LLAMA_LAYER + (
    Entry(_M + "self_attention.linear_qkv.bias",
          (_H + "self_attn.q_proj.bias", _H + "self_attn.k_proj.bias", _H + "self_attn.v_proj.bias"),
          fuse="qkv", tp_dim=0),
)
QWEN3_LAYER: tuple[Entry, ...] = LLAMA_LAYER + (
    Entry(_M + "self_attention.q_layernorm.weight", (_H + "self_attn.q_norm.weight",)),
    Entry(_M + "self_attention.k_layernorm.weight", (_H + "self_attn.k_norm.weight",)),
)
LAYER_MAPS: dict[str, tuple[Entry, ...]] = {"llama": LLAMA_LAYER, "qwen2": QWEN2_LAYER, "qwen3": QWEN3_LAYER}

EMBEDDING = Entry("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), tp_dim=0, vocab=True)
FINAL_NORM = Entry("decoder.final_layernorm.weight", ("model.norm.weight",))
OUTPUT = Entry("output_layer.weight", ("lm_head.weight",), tp_dim=0, vocab=True)
# With tied embeddings the last pipeline stage still holds a copy of the embedding.
OUTPUT_TIED = Entry("output_layer.weight", ("model.embed_tokens.weight",), tp_dim=0, vocab=True)

TE_ALIASES: dict[str, str] = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
}
"""Transformer Engine spec name -> local spec name (TE fuses the norms into the linears)."""


@dataclass(frozen=True)
class Shapes:
    """What the layout conversions need to know about the model."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    padded_vocab_size: int


def entries(family: str, tie_embeddings: bool) -> list[Entry]:
    """Every entry of a family's map (templates; ``{layer}`` unfilled)."""
    if family not in LAYER_MAPS:
        raise ConfigError("model_type", f"no name map for {family!r}; supported: {', '.join(sorted(LAYER_MAPS))}")
    return [EMBEDDING, *LAYER_MAPS[family], FINAL_NORM, OUTPUT_TIED if tie_embeddings else OUTPUT]


def normalize_name(name: str) -> str:
    """Map a TE-spec Megatron name to the local-spec name used in the maps."""
    for te_name, local in TE_ALIASES.items():
        if name.endswith(te_name):
            return name[: -len(te_name)] + local
    return name


_LAYER_RE = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")


def lookup(family: str, tie_embeddings: bool, megatron_name: str) -> tuple[Entry, int | None]:
    """The entry for a concrete Megatron name (global layer index) and its layer."""
    name = normalize_name(megatron_name)
    match = _LAYER_RE.match(name)
    template, layer = (_M + match.group(2), int(match.group(1))) if match else (name, None)
    for entry in entries(family, tie_embeddings):
        if entry.megatron == template:
            return entry, layer
    raise KeyError(f"no {family} name-map entry for Megatron parameter {megatron_name!r}")


def to_megatron(entry: Entry, hf: list[torch.Tensor], shapes: Shapes) -> torch.Tensor:
    """Full Megatron tensor (TP=1 layout) from the entry's HF tensors, in ``entry.hf`` order."""
    if entry.fuse == "qkv":
        q, k, v = hf
        groups, per_group = shapes.num_kv_heads, shapes.num_heads // shapes.num_kv_heads
        rest = q.shape[1:]
        q = q.reshape(groups, per_group * shapes.head_dim, *rest)
        k = k.reshape(groups, shapes.head_dim, *rest)
        v = v.reshape(groups, shapes.head_dim, *rest)
        return torch.cat([q, k, v], dim=1).reshape(-1, *rest)
    if entry.fuse == "gate_up":
        return torch.cat(hf, dim=0)
    (tensor,) = hf
    if entry.vocab and tensor.shape[0] < shapes.padded_vocab_size:
        pad = tensor.new_zeros(shapes.padded_vocab_size - tensor.shape[0], *tensor.shape[1:])
        tensor = torch.cat([tensor, pad], dim=0)
    return tensor


def to_hf(entry: Entry, full: torch.Tensor, shapes: Shapes) -> list[torch.Tensor]:
    """The inverse of ``to_megatron``: HF tensors in ``entry.hf`` order."""
    if entry.fuse == "qkv":
        groups, per_group = shapes.num_kv_heads, shapes.num_heads // shapes.num_kv_heads
        rest = full.shape[1:]
        grouped = full.reshape(groups, (per_group + 2) * shapes.head_dim, *rest)
        q, k, v = torch.split(grouped, [per_group * shapes.head_dim, shapes.head_dim, shapes.head_dim], dim=1)
        return [t.reshape(-1, *rest).contiguous() for t in (q, k, v)]
    if entry.fuse == "gate_up":
        return [t.contiguous() for t in torch.chunk(full, 2, dim=0)]
    return [full[: shapes.vocab_size].contiguous() if entry.vocab else full]


def shard(entry: Entry, full: torch.Tensor, tp_rank: int, tp: int) -> torch.Tensor:
    """This TP rank's part of a full Megatron tensor."""
    if entry.tp_dim is None or tp == 1:
        return full
    if entry.fuse == "gate_up":
        # Megatron's column-parallel fc1 holds [gate_r; up_r] on rank r, not a row block.
        gate, up = torch.chunk(full, 2, dim=0)
        return torch.cat([gate.chunk(tp)[tp_rank], up.chunk(tp)[tp_rank]], dim=0)
    return torch.chunk(full, tp, dim=entry.tp_dim)[tp_rank]


def unshard(entry: Entry, shards: list[torch.Tensor]) -> torch.Tensor:
    """The full Megatron tensor from all TP ranks' shards (in rank order)."""
    if entry.tp_dim is None or len(shards) == 1:
        return shards[0]
    if entry.fuse == "gate_up":
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(shards, dim=entry.tp_dim)


def hf_tensors(entry: Entry, layer: int | None, full: torch.Tensor,
               shapes: Shapes) -> list[tuple[str, torch.Tensor]]:
    """(HF name, tensor) pairs of one full Megatron tensor; the per-tensor step shared by
    the offline converter and the live export (megatron_pc.models.export)."""
    return [(hf_name.format(layer=layer), part) for hf_name, part in zip(entry.hf, to_hf(entry, full, shapes))]


def megatron_to_hf(family: str, tie_embeddings: bool, full: dict[str, torch.Tensor],
                   shapes: Shapes) -> dict[str, torch.Tensor]:
    """HF-named tensors from full Megatron tensors (global layer indices); the tied output
    layer is dropped because HF stores it once as the embedding."""
    out: dict[str, torch.Tensor] = {}
    for name, tensor in full.items():
        if name.endswith("_extra_state"):
            continue
        entry, layer = lookup(family, tie_embeddings, name)
        if entry is OUTPUT_TIED:
            continue
        out.update(hf_tensors(entry, layer, tensor, shapes))
    return out


# ---- Megatron distributed checkpoints -----------------------------------------------------

_CHECKPOINT_KEYS: dict[str, str] = {local: te_name for te_name, local in TE_ALIASES.items()}
"""Local-spec layer name -> the key Megatron checkpoints use (the local spec saves its norms
under the TE names, so checkpoints do not depend on the layer spec)."""


def checkpoint_key(megatron_name: str) -> tuple[str, int | None]:
    """The dist-checkpoint key of a concrete Megatron name, and its layer index.

    Megatron stacks the layers of a key along a leading axis of length num_layers: layer
    ``l`` of ``decoder.layers.{l}.X`` is slice ``l`` of the tensor keyed ``decoder.layers.X``."""
    name = normalize_name(megatron_name)
    match = _LAYER_RE.match(name)
    if not match:
        return name, None
    rest = match.group(2)
    return "decoder.layers." + _CHECKPOINT_KEYS.get(rest, rest), int(match.group(1))


def megatron_shape(entry: Entry, shapes: Shapes, hidden: int, ffn: int) -> tuple[int, ...]:
    """The full (TP=1) shape of an entry's Megatron tensor."""
    hd = shapes.head_dim
    qkv = (shapes.num_heads + 2 * shapes.num_kv_heads) * hd
    table = {
        EMBEDDING.megatron: (shapes.padded_vocab_size, hidden),
        OUTPUT.megatron: (shapes.padded_vocab_size, hidden),
        FINAL_NORM.megatron: (hidden,),
        _M + "input_layernorm.weight": (hidden,),
        _M + "pre_mlp_layernorm.weight": (hidden,),
        _M + "self_attention.linear_qkv.weight": (qkv, hidden),
        _M + "self_attention.linear_qkv.bias": (qkv,),
        _M + "self_attention.linear_proj.weight": (hidden, shapes.num_heads * hd),
        _M + "self_attention.q_layernorm.weight": (hd,),
        _M + "self_attention.k_layernorm.weight": (hd,),
        _M + "mlp.linear_fc1.weight": (2 * ffn, hidden),
        _M + "mlp.linear_fc2.weight": (hidden, ffn),
    }
    return table[entry.megatron]
