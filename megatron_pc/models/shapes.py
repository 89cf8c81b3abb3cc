"""Model shapes (for the planner, the projection and FLOP counting): read from a Hugging Face
config.json, or from a table of known architectures when the model is not on this machine
(planning happens before download).

Table values are copied from each model's published config.json on the Hugging Face Hub
(num_hidden_layers, hidden_size, num_attention_heads, num_key_value_heads, intermediate_size,
vocab_size, head_dim, tie_word_embeddings).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_pc.errors import ConfigError


@dataclass(frozen=True)
class ModelShape:
    """The sizes of a decoder-only transformer that decide its memory footprint."""

    name: str
    """Architecture name (table key) or the model directory."""
    layers: int
    """Transformer layers (num_hidden_layers)."""
    hidden: int
    """Hidden size (hidden_size)."""
    heads: int
    """Attention (query) heads (num_attention_heads)."""
    kv_heads: int
    """Key/value heads (num_key_value_heads); < heads means grouped-query attention."""
    intermediate: int
    """SwiGLU MLP width (intermediate_size)."""
    vocab: int
    """Vocabulary size (vocab_size), padded as in the checkpoint."""
    head_dim: int
    """Per-head dimension (head_dim, else hidden / heads)."""
    tied_embeddings: bool
    """Input embedding and output layer share one matrix (tie_word_embeddings)."""

    @property
    def layer_params(self) -> int:
        """Parameters of one layer: Q/K/V/O projections, SwiGLU MLP, norms (biases ignored)."""
        q = self.heads * self.head_dim
        kv = self.kv_heads * self.head_dim
        attention = self.hidden * (q + 2 * kv) + q * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return attention + mlp + 2 * self.hidden + 2 * self.head_dim

    @property
    def embedding_params(self) -> int:
        """Parameters of the input embedding (the output layer has as many unless tied)."""
        return self.vocab * self.hidden

    @property
    def total_params(self) -> int:
        """All parameters of the model."""
        output = 0 if self.tied_embeddings else self.embedding_params
        return self.layers * self.layer_params + self.embedding_params + output + self.hidden


# Exact names only (no substring matching): a near-miss name must fail loudly, not guess.
KNOWN_MODELS: dict[str, ModelShape] = {
    shape.name: shape
    for shape in (
        ModelShape("Qwen3-14B", layers=40, hidden=5120, heads=40, kv_heads=8, intermediate=17408, vocab=151936, head_dim=128, tied_embeddings=False),
        ModelShape("Qwen3-8B", layers=36, hidden=4096, heads=32, kv_heads=8, intermediate=12288, vocab=151936, head_dim=128, tied_embeddings=False),
        ModelShape("Qwen3-4B", layers=36, hidden=2560, heads=32, kv_heads=8, intermediate=9728, vocab=151936, head_dim=128, tied_embeddings=True),
        # The base checkpoint the released 4B run trains: the same architecture as Qwen3-4B.
        ModelShape("Qwen3-4B-Base", layers=36, hidden=2560, heads=32, kv_heads=8, intermediate=9728, vocab=151936, head_dim=128, tied_embeddings=True),
        ModelShape("Qwen2.5-Math-1.5B", layers=28, hidden=1536, heads=12, kv_heads=2, intermediate=8960, vocab=151936, head_dim=128, tied_embeddings=True),
    )
}


def shape_from_hf_config(config: dict[str, Any], name: str) -> ModelShape:
    """A :class:`ModelShape` from the fields of a Hugging Face config.json."""
    try:
        heads = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
        return ModelShape(
            name=name,
            layers=int(config["num_hidden_layers"]),
            hidden=hidden,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            intermediate=int(config["intermediate_size"]),
            vocab=int(config["vocab_size"]),
            head_dim=int(config.get("head_dim") or hidden // heads),
            tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        )
    except KeyError as err:
        raise ConfigError("model.path", f"{name}/config.json lacks {err.args[0]}") from None


def load_model_shape(path: str) -> ModelShape:
    """The shape of the model at ``path``: its config.json when the directory exists, else the
    built-in entry whose name equals ``path`` or its last component (``Qwen/Qwen3-14B``)."""
    config_file = Path(path) / "config.json"
    if config_file.is_file():
        return shape_from_hf_config(json.loads(config_file.read_text()), path)
    for key in (path, Path(path).name):
        if key in KNOWN_MODELS:
            return KNOWN_MODELS[key]
    known = ", ".join(KNOWN_MODELS)
    raise ConfigError("model.path", f"{path!r} has no config.json and is not a known architecture ({known})")
