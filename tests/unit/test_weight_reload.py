"""Which modules a weight-sync bucket reloads (megatron_pc/weight_sync/reload.py): those that own
parameters under the modules its HF names reach, and no other (vLLM's whole-model reload logs a
line for every module left out of a bucket)."""

from __future__ import annotations

import torch
from torch import nn

from megatron_pc.weight_sync.reload import modules_of


class _Rotary(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("cos_sin_cache", torch.zeros(4))


class _Attention(nn.Module):
    """vLLM's layout: q, k and v fused into one module, a rotary cache with buffers only."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv_proj, self.o_proj, self.rotary_emb = nn.Linear(4, 12), nn.Linear(4, 4), _Rotary()


class _Layer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.self_attn, self.input_layernorm = _Attention(), nn.LayerNorm(4)


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed_tokens, self.layers, self.norm = nn.Embedding(8, 4), nn.ModuleList([_Layer(), _Layer()]), nn.LayerNorm(4)


class _CausalLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.model, self.lm_head = _Model(), nn.Linear(4, 8)


def test_a_layers_bucket_reloads_its_fused_modules_and_norms_but_not_the_rotary_cache_nor_other_layers() -> None:
    lm = _CausalLM()
    names = [f"model.layers.1.self_attn.{p}_proj.weight" for p in "qkvo"] + ["model.layers.1.input_layernorm.weight"]
    layer = lm.model.layers[1]
    assert modules_of(lm, names) == [layer.self_attn.qkv_proj, layer.self_attn.o_proj, layer.input_layernorm]


def test_the_outer_modules_are_reloaded_by_their_own_names() -> None:
    lm = _CausalLM()
    assert modules_of(lm, ["model.embed_tokens.weight", "lm_head.weight"]) == [lm.model.embed_tokens, lm.lm_head]
    assert modules_of(lm, ["model.norm.weight"]) == [lm.model.norm]
