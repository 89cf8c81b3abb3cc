"""HF <-> Megatron name maps and config parsing (pure tensors, no process groups)."""

from __future__ import annotations

import pytest
import torch

from megatron_pc.errors import ConfigError
from megatron_pc.models import name_maps
from megatron_pc.models.hf_config import arch_from_dict, check_parallel_sizes
from megatron_pc.models.provider import padded_vocab_size

SHAPES = name_maps.Shapes(num_heads=4, num_kv_heads=2, head_dim=8, vocab_size=10, padded_vocab_size=128)
HIDDEN, FFN = 32, 48


def _hf_state(family: str, tie: bool) -> dict[str, torch.Tensor]:
    q, kv = SHAPES.num_heads * SHAPES.head_dim, SHAPES.num_kv_heads * SHAPES.head_dim
    shapes = {"q_proj.weight": (q, HIDDEN), "k_proj.weight": (kv, HIDDEN), "v_proj.weight": (kv, HIDDEN),
              "o_proj.weight": (HIDDEN, q)}
    if family == "qwen2":
        shapes |= {"q_proj.bias": (q,), "k_proj.bias": (kv,), "v_proj.bias": (kv,)}
    if family == "qwen3":
        shapes |= {"q_norm.weight": (SHAPES.head_dim,), "k_norm.weight": (SHAPES.head_dim,)}
    state = {f"model.layers.0.self_attn.{k}": torch.randn(v) for k, v in shapes.items()}
    state |= {f"model.layers.0.mlp.{k}": torch.randn(FFN, HIDDEN) for k in ("gate_proj.weight", "up_proj.weight")}
    state |= {"model.layers.0.mlp.down_proj.weight": torch.randn(HIDDEN, FFN),
              "model.layers.0.input_layernorm.weight": torch.randn(HIDDEN),
              "model.layers.0.post_attention_layernorm.weight": torch.randn(HIDDEN),
              "model.norm.weight": torch.randn(HIDDEN), "model.embed_tokens.weight": torch.randn(10, HIDDEN)}
    if not tie:
        state["lm_head.weight"] = torch.randn(10, HIDDEN)
    return state


def _to_megatron(family: str, tie: bool, hf: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for entry in name_maps.entries(family, tie):
        layer = 0 if "{layer}" in entry.megatron else None
        out[entry.megatron.format(layer=layer)] = name_maps.to_megatron(
            entry, [hf[n.format(layer=layer)] for n in entry.hf], SHAPES)
    return out


@pytest.mark.parametrize("family,tie", [("llama", True), ("llama", False), ("qwen2", False), ("qwen3", True)])
def test_hf_to_megatron_to_hf_round_trips_every_tensor(family: str, tie: bool) -> None:
    hf = _hf_state(family, tie)
    back = name_maps.megatron_to_hf(family, tie, _to_megatron(family, tie, hf), SHAPES)
    assert sorted(back) == sorted(hf)
    assert all(torch.equal(back[k], hf[k]) for k in hf)


def test_fused_qkv_is_grouped_per_kv_head_as_q_heads_then_k_then_v() -> None:
    hf = _hf_state("qwen2", False)
    qkv = _to_megatron("qwen2", False, hf)["decoder.layers.0.self_attention.linear_qkv.weight"]
    hd, group = SHAPES.head_dim, 2 * SHAPES.head_dim + 2 * SHAPES.head_dim  # 2 q heads + k + v
    q, k = hf["model.layers.0.self_attn.q_proj.weight"], hf["model.layers.0.self_attn.k_proj.weight"]
    assert torch.equal(qkv[group: group + 2 * hd], q[2 * hd: 4 * hd])  # group 1 starts with q heads 2, 3
    assert torch.equal(qkv[group + 2 * hd: group + 3 * hd], k[hd: 2 * hd])


def test_fc1_tp_shard_holds_gate_and_up_slices_and_unshards_back() -> None:
    entry, _ = name_maps.lookup("llama", False, "decoder.layers.3.mlp.linear_fc1.weight")
    full = torch.arange(8.0).reshape(8, 1)  # gate rows 0-3, up rows 4-7
    shards = [name_maps.shard(entry, full, r, 2) for r in range(2)]
    assert shards[0].flatten().tolist() == [0, 1, 4, 5]
    assert torch.equal(name_maps.unshard(entry, shards), full)


def test_embedding_rows_are_padded_with_zeros_and_the_padding_is_dropped_back() -> None:
    entry = name_maps.EMBEDDING
    emb = torch.randn(10, HIDDEN)
    full = name_maps.to_megatron(entry, [emb], SHAPES)
    assert full.shape == (128, HIDDEN) and full[10:].abs().sum() == 0
    assert torch.equal(name_maps.to_hf(entry, full, SHAPES)[0], emb)


def test_te_spec_names_map_onto_the_local_spec_entries() -> None:
    entry, layer = name_maps.lookup("qwen3", False, "decoder.layers.5.self_attention.linear_qkv.layer_norm_weight")
    assert entry.hf == ("model.layers.{layer}.input_layernorm.weight",) and layer == 5


def test_unsupported_model_type_lists_the_supported_ones() -> None:
    with pytest.raises(ConfigError, match="llama, qwen2, qwen3"):
        arch_from_dict({"model_type": "mistral"})


def test_rope_theta_is_read_from_rope_parameters_and_unknown_scaling_is_rejected() -> None:
    base = dict(model_type="llama", vocab_size=10, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                num_attention_heads=2)
    assert arch_from_dict({**base, "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}).rope_theta == 5e5
    assert arch_from_dict({**base, "rope_theta": 1e6}).rope_theta == 1e6
    with pytest.raises(ConfigError, match="rope"):
        arch_from_dict({**base, "rope_parameters": {"rope_theta": 1e4, "rope_type": "yarn", "factor": 4.0}})


def test_parallel_sizes_must_divide_heads_and_layers() -> None:
    arch = arch_from_dict(dict(model_type="qwen2", vocab_size=10, hidden_size=96, intermediate_size=96,
                               num_hidden_layers=3, num_attention_heads=3, num_key_value_heads=3))
    with pytest.raises(ConfigError, match="tensor_parallel"):
        check_parallel_sizes(arch, 2, 1)
    with pytest.raises(ConfigError, match="pipeline_parallel"):
        check_parallel_sizes(arch, 1, 2)
    check_parallel_sizes(arch, 3, 3)


def test_padded_vocab_is_the_same_for_tp_sizes_that_divide_128() -> None:
    assert {padded_vocab_size(49152 + 5, tp) for tp in (1, 2, 4, 8)} == {49280}
    assert padded_vocab_size(100, 3) % 3 == 0
