"""The memory model's activation term (megatron_pc/launch/memory_model.py) is the measurement:
benchmarks/activations.py re-measured here at small widths, on the real Megatron layer, with
torch.autograd.graph.saved_tensors_hooks. At Qwen3-14B's widths (bf16, TP 1) it measured
263,480 B a token a layer for ours (the model: 263,528) and, for Megatron's local spec, 6.025 B a
score element (the model: 6 + 1/40)."""

from __future__ import annotations

import pytest

from benchmarks.activations import Widths, fit_in_fresh_process
from megatron_pc.launch import memory_model as mm
from megatron_pc.launch.plan import Layout
from megatron_pc.models.shapes import KNOWN_MODELS

# Grouped-query widths of two shapes (query heads a multiple of KV heads, as every paper model).
WIDTHS = (Widths(hidden=256, intermediate=704, heads=4, kv_heads=2, head_dim=64),
          Widths(hidden=256, intermediate=512, heads=8, kv_heads=4, head_dim=32))


@pytest.mark.parametrize("widths", WIDTHS, ids=["4q2kv", "8q4kv"])
def test_activation_term_equals_the_measured_saved_bytes(widths: Widths) -> None:
    sdpa, local = fit_in_fresh_process(widths, ("sdpa", "local"))
    predicted = mm.predicted_layer_bytes(widths.hidden, widths.q, widths.kv, widths.intermediate, "sdpa", 2,
                                         widths.heads, widths.kv_heads, widths.head_dim)
    assert sdpa.bytes_per_token == pytest.approx(predicted["per_token"], rel=0.01)
    # Ours keeps no score matrix; the split by SP is the four hidden-width inputs (+ two fp32 rms).
    assert sdpa.bytes_per_score_element == pytest.approx(0.0, abs=0.05)
    assert sdpa.sp_bytes_per_token == pytest.approx(mm.SP_VALUES * widths.hidden * 2 + 2 * mm.FP32_ROW_VALUES, rel=0.01)
    # Megatron's unfused attention: probabilities, fp32 softmax and a shared mask per score element.
    local_predicted = mm.predicted_layer_bytes(widths.hidden, widths.q, widths.kv, widths.intermediate, "local", 2, widths.heads)
    assert local.bytes_per_score_element == pytest.approx(local_predicted["per_score_element"], rel=0.01)
    assert local.bytes_per_score_element > 6


def test_the_model_at_14b_tp2_with_sp_holds_the_measured_term() -> None:
    model = KNOWN_MODELS["Qwen3-14B"]
    m = Layout(nodes=8, gpus_per_node=8, device=mm.DEVICES["H200"], placement="colocated", tensor_parallel=2,
               pipeline_parallel=1, data_parallel=32, engines=32, engine_tensor_parallel=2, gpu_memory_utilization=0.6,
               micro_batch_tokens=6144, sequence_tokens=6144).memory_inputs()
    per, how = mm._per_token_layer_bytes(model, m)
    # (4h/2 + (4q + 3kv + 5i)/2 + 4d) x 2 B + (2/2 + (40 + 8 + 40)/2) x 4 B
    assert per == (4 * 5120 / 2 + (4 * 5120 + 3 * 1024 + 5 * 17408) / 2 + 4 * 128) * 2 + (1 + 44) * 4 == 132_276
    assert "measured" in how
