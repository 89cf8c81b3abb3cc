"""The architecture of a Hugging Face checkpoint, read from its config.json, and the registry
of supported model families (keyed by the exact ``model_type``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from megatron_pc.errors import ConfigError


@dataclass(frozen=True)
class Family:
    """What distinguishes one decoder family from plain Llama."""

    name: str
    qkv_bias: bool
    """Qwen2 has biases on q/k/v projections."""
    qk_norm: bool
    """Qwen3 applies RMSNorm per head to queries and keys."""


# Exact model_type -> family; never substring matching (STYLE.md rule 3).
FAMILIES: dict[str, Family] = {
    "llama": Family("llama", qkv_bias=False, qk_norm=False),
    "qwen2": Family("qwen2", qkv_bias=True, qk_norm=False),
    "qwen3": Family("qwen3", qkv_bias=False, qk_norm=True),
}

# Megatron's GPTModel implements only this Llama-3 scaling (fixed low/high factors and
# original context); any other rope_scaling would silently give different positions.
_LLAMA3_ROPE = {"low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


@dataclass(frozen=True)
class HFArch:
    """The fields of an HF decoder config that fix the Megatron model's shape."""

    family: Family
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling_factor: float | None
    tie_embeddings: bool
    max_position_embeddings: int


def family_for(model_type: str) -> Family:
    """The family registered for ``model_type``; unknown types name the supported ones."""
    if model_type not in FAMILIES:
        raise ConfigError("model_type", f"unsupported {model_type!r}; supported: {', '.join(sorted(FAMILIES))}")
    return FAMILIES[model_type]


def _rope(cfg: dict[str, Any]) -> tuple[float, float | None]:
    # transformers >= 5 writes rope_parameters; older configs have rope_theta / rope_scaling.
    params = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
    theta = float(params.get("rope_theta", cfg.get("rope_theta", 10000.0)) or 10000.0)
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return theta, None
    if rope_type == "llama3" and all(float(params.get(k, v)) == v for k, v in _LLAMA3_ROPE.items()):
        return theta, float(params["factor"])
    raise ConfigError("rope_parameters", f"unsupported RoPE scaling {params!r}; supported: default, llama3 "
                      f"with {_LLAMA3_ROPE}")


def arch_from_dict(cfg: dict[str, Any]) -> HFArch:
    """Read an HF config dict; raise ConfigError on anything the Megatron model cannot express."""
    family = family_for(str(cfg.get("model_type")))
    if cfg.get("hidden_act", "silu") != "silu":
        raise ConfigError("hidden_act", f"only silu (SwiGLU) is supported, got {cfg.get('hidden_act')!r}")
    if cfg.get("mlp_bias"):
        raise ConfigError("mlp_bias", "MLP biases are not supported")
    if family.name == "llama" and cfg.get("attention_bias"):
        raise ConfigError("attention_bias", "Llama with attention biases is not supported")
    if cfg.get("use_sliding_window"):
        raise ConfigError("use_sliding_window", "sliding-window attention is not supported")
    heads = _positive(cfg, "num_attention_heads")
    kv_heads = _positive(cfg, "num_key_value_heads") if cfg.get("num_key_value_heads") is not None else heads
    hidden = _positive(cfg, "hidden_size")
    if heads % kv_heads:
        raise ConfigError("num_key_value_heads", f"{kv_heads} must divide num_attention_heads ({heads})")
    if cfg.get("head_dim") is None and hidden % heads:
        raise ConfigError("num_attention_heads", f"{heads} must divide hidden_size ({hidden}) when there is no head_dim")
    theta, factor = _rope(cfg)
    return HFArch(
        family=family,
        vocab_size=_positive(cfg, "vocab_size"),
        hidden_size=hidden,
        intermediate_size=_positive(cfg, "intermediate_size"),
        num_layers=_positive(cfg, "num_hidden_layers"),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=_positive(cfg, "head_dim") if cfg.get("head_dim") is not None else hidden // heads,
        rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
        rope_theta=theta,
        rope_scaling_factor=factor,
        tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
    )


def _positive(cfg: dict[str, Any], key: str) -> int:
    """``cfg[key]`` as a positive integer, or a ConfigError naming the key."""
    value = cfg.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(key, f"must be a positive integer, got {value!r}" if key in cfg else "is missing")
    return value


def load_arch(model_dir: str | Path) -> HFArch:
    """Read ``model_dir/config.json``."""
    path = Path(model_dir) / "config.json"
    if not path.is_file():
        raise ConfigError("model.path", f"{path} does not exist (expected a Hugging Face model directory)")
    return arch_from_dict(json.loads(path.read_text()))


def check_parallel_sizes(arch: HFArch, tp: int, pp: int) -> None:
    """Raise ConfigError unless TP divides the heads and KV heads and PP divides the layers."""
    if arch.num_heads % tp or arch.num_kv_heads % tp:
        raise ConfigError("model.tensor_parallel", f"{tp} must divide the attention heads ({arch.num_heads}) "
                          f"and the KV heads ({arch.num_kv_heads})")
    if arch.intermediate_size % tp:
        raise ConfigError("model.tensor_parallel", f"{tp} must divide intermediate_size ({arch.intermediate_size})")
    if arch.num_layers % pp:
        raise ConfigError("model.pipeline_parallel", f"{pp} must divide the layers ({arch.num_layers})")
