"""The memory model's activation term (megatron_pc/launch/memory_model.py), measured on CPU with
saved_tensors_hooks (benchmarks/activations.py), against what the CUDA caching allocator holds:
one Megatron layer at Qwen3-14B's widths in bf16 on one GPU, our spec (torch SDPA: no score
matrix) and Megatron's local spec (unfused attention: 6 B a score element a head + a 1 B mask).

Runs in the pytest process on a world of one rank (NCCL). Skipped without CUDA by
tests/conftest.py; everything imported at module level imports without CUDA."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from benchmarks.activations import WIDTHS, Widths, build_layer
from megatron_pc.launch import memory_model as mm

pytestmark = pytest.mark.gpu

W = Widths(**WIDTHS["14b"])


def _warm_up(layer: torch.nn.Module, rope: torch.nn.Module, tokens: int) -> None:
    """One forward and backward at the longest length first: what stays allocated after the first
    call (cuBLAS workspaces, Megatron's global [heads, s, s] matmul buffer of the local spec) is
    not an activation, and must not be counted as one."""
    x = torch.randn(tokens, 1, W.hidden, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    out, _ = layer(x, attention_mask=None, rotary_pos_emb=rope(tokens))
    out.float().sum().backward()
    layer.zero_grad(set_to_none=True)
    torch.cuda.synchronize()


def _held_and_peak(layer: torch.nn.Module, rope: torch.nn.Module, tokens: int) -> tuple[int, int]:
    """(bytes the forward leaves allocated for the backward, peak bytes above the start) of one
    forward of ``tokens`` tokens; the input and the output are not counted."""
    x = torch.randn(tokens, 1, W.hidden, dtype=torch.bfloat16, device="cuda", requires_grad=True)
    emb = rope(tokens)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out, _ = layer(x, attention_mask=None, rotary_pos_emb=emb)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base - out.untyped_storage().nbytes()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    torch.cuda.empty_cache()
    return held, peak


def test_our_spec_holds_the_modelled_bytes_a_token_at_14b_widths(world: None, record_figure: Callable[..., None]) -> None:
    layer, rope = build_layer(W, "sdpa", torch.bfloat16)
    layer.train()
    per_token = mm.layer_bytes_per_token(W.hidden, W.q, W.kv, W.intermediate, W.heads, W.kv_heads, W.head_dim, "sdpa", 2)
    _warm_up(layer, rope, 4096)
    for tokens in (1024, 4096):
        held, peak = _held_and_peak(layer, rope, tokens)
        record_figure(spec="sdpa", tokens=tokens, held_bytes=held, peak_bytes=peak, model_bytes=int(per_token * tokens))
        # No score matrix: a score term at 4096 tokens would be 40 x 4096^2 x 6 B = 4 GB against ~1.1 GB.
        assert held == pytest.approx(per_token * tokens, rel=0.10), (tokens, held, per_token * tokens)
        assert held <= peak <= 1.5 * per_token * tokens


def test_megatron_local_spec_holds_the_modelled_score_bytes(world: None, record_figure: Callable[..., None]) -> None:
    layer, rope = build_layer(W, "local", torch.bfloat16)
    layer.train()
    short, long = 1024, 2048
    _warm_up(layer, rope, long)
    (held_short, _), (held_long, peak_long) = _held_and_peak(layer, rope, short), _held_and_peak(layer, rope, long)
    # held = a x s + b x s^2: b from the two lengths, against the model's bytes a score row element.
    b = (held_long / long - held_short / short) / (long - short)
    modelled = mm.score_bytes(W.heads, 1, 1, 1)
    record_figure(spec="local", score_bytes_per_s2=b, model_score_bytes_per_s2=modelled, held_2048=held_long, peak_2048=peak_long)
    assert b == pytest.approx(modelled, rel=0.10)
