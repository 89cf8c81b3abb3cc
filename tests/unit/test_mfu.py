"""The analytic FLOP count and MFU per phase (megatron_pc.metrics.mfu)."""

from __future__ import annotations

import pytest

from megatron_pc.models.shapes import KNOWN_MODELS, ModelShape
from megatron_pc.metrics.mfu import cpu_peak_flops, forward_flops, gpu_peak_flops, matmul_params, step_flops, step_mfu

TOY = ModelShape("toy", layers=2, hidden=8, heads=2, kv_heads=1, intermediate=16, vocab=10, head_dim=4, tied_embeddings=True)


def test_matmul_params_count_projections_mlp_and_the_output_layer() -> None:
    # q 8x8, k and v 8x4 each, o 8x8, MLP 3 x 8 x 16, per layer; output 8 x 10.
    assert matmul_params(TOY) == 2 * (64 + 32 + 32 + 64 + 384) + 80
    # Qwen3-14B: 14.8B parameters in all, of which 13.2B are in the layers and 0.78B in the
    # output layer; the input embedding (0.78B) is a lookup.
    shape = KNOWN_MODELS["Qwen3-14B"]
    assert matmul_params(shape) == pytest.approx(shape.total_params - shape.embedding_params, rel=1e-3)


def test_forward_flops_are_2p_per_token_plus_attention_pairs() -> None:
    assert forward_flops(TOY, 1, 0) == 2 * matmul_params(TOY)
    assert forward_flops(TOY, 0, 5) == 4 * 2 * 2 * 4 * 5


def test_step_flops_and_mfu_per_phase() -> None:
    row = {"generated_tokens": 100, "gen_prompt_tokens": 20, "gen_attention_pairs": 1000.0, "trained_tokens": 300.0,
           "trained_attention_pairs": 2000.0, "time_generate": 2.0, "time_logprob": 0.5, "time_update": 1.0}  # fmt: skip
    flops = step_flops(TOY, row)
    assert set(flops) == {"generate", "logprob", "update"}  # no reference model ran
    assert flops["generate"] == forward_flops(TOY, 120, 1000.0)
    assert flops["update"] == 3 * flops["logprob"] == 3 * forward_flops(TOY, 300, 2000.0)
    mfu = step_mfu(TOY, row, peak_flops=1e6)
    assert mfu["generate"] == pytest.approx(flops["generate"] / 2e6)
    assert mfu["update"] == pytest.approx(flops["update"] / 1e6)


def test_gpu_peaks_come_from_the_table_by_name() -> None:
    assert gpu_peak_flops("NVIDIA H200") == 989e12 and gpu_peak_flops("NVIDIA A100-SXM4-80GB") == 312e12
    assert gpu_peak_flops("NVIDIA GeForce GTX 1080") is None


def test_the_cpu_probe_measures_a_plausible_peak() -> None:
    flops = cpu_peak_flops(threads=1, size=256, seconds=0.2)
    assert 1e8 < flops < 1e13  # between a slow core and many fast ones
