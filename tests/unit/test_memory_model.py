"""The memory model of `megatron-pc plan` (megatron_pc/launch/memory_model.py): each term of
the Qwen3-14B paper layout pinned to a computation by hand from the published config.json."""

from __future__ import annotations

from dataclasses import replace

import pytest

from megatron_pc.launch import memory_model as mm
from megatron_pc.models.shapes import KNOWN_MODELS
from megatron_pc.launch.plan import Layout, plan_layout

GIB = 2**30
MODEL = KNOWN_MODELS["Qwen3-14B"]
# configs/qwen3_14b.yaml on 8 nodes x 8 H200: policy TP 2 x DP 32, 32 engines of TP 2.
LAYOUT = Layout(
    nodes=8, gpus_per_node=8, device=mm.DEVICES["H200"], placement="colocated",
    tensor_parallel=2, pipeline_parallel=1, data_parallel=32, engines=32, engine_tensor_parallel=2,
    gpu_memory_utilization=0.6, micro_batch_tokens=6144, sequence_tokens=6144,
)  # fmt: skip

# By hand: h 5120, q 40 x 128 = 5120, kv 8 x 128 = 1024, i 17408, vocab 151936 (a multiple of 128).
LAYER = 5120 * (5120 + 2 * 1024) + 5120 * 5120 + 3 * 5120 * 17408 + 2 * 5120 + 2 * 128  # 330,311,936
EMBEDDING = 151936 * 5120
LOCAL = (40 * LAYER + 2 * EMBEDDING) / 2  # untied: embedding and output layer, / TP 2
H200_GIB = 143771 / 1024


def _terms(phase_name: str, layout: Layout = LAYOUT) -> dict[str, float]:
    phase = next(p for p in plan_layout(MODEL, layout).phases if p.name == phase_name)
    return {t.name: t.gib for t in phase.terms}


def test_h200_is_the_memory_torch_reports_not_141_gb() -> None:
    assert mm.DEVICES["H200"].total_gib == pytest.approx(140.4, abs=0.05)
    assert mm.device_for(141.0) is mm.DEVICES["H200"]
    assert mm.device_for(100.0).total_bytes == 100 * 10**9


def test_policy_update_terms_of_the_14b_layout_equal_the_hand_computation() -> None:
    terms = _terms("policy update")
    assert terms["policy weights (bf16)"] == pytest.approx(LOCAL * 2 / GIB)  # 13.75
    assert terms["policy gradient buffer (fp32)"] == pytest.approx(LOCAL * 4 / GIB)  # 27.51
    assert terms["optimizer states (sharded over DP=32)"] == pytest.approx(LOCAL * 12 / 32 / GIB)  # 2.58
    # Measured (benchmarks/activations.py, tests/unit/test_activation_term.py): 4h / SP, (4q + 3kv + 5i) / TP,
    # 4 head-dim values of RoPE, bf16; fp32 rms of two norms / SP and of 40 + 8 heads, SDPA's 40 statistics / TP.
    per_token_layer = 2 * (4 * 5120 / 2 + (4 * 5120 + 3 * 1024 + 5 * 17408) / 2 + 4 * 128) + 4 * (2 / 2 + 88 / 2)
    assert terms["activations (40 layers, 1F1B)"] == pytest.approx(6144 * 40 * per_token_layer / GIB)  # 30.28
    # The bf16 logits and their gradient whole; three fp32 temporaries of one 1024-token chunk.
    assert terms["logits + their gradient"] == pytest.approx(2 * 6144 * 75968 * 2 / GIB)  # 1.74
    assert terms["log-prob chunk temporaries (fp32)"] == pytest.approx(3 * 1024 * 75968 * 4 / GIB)  # 0.87
    assert terms["policy runtime"] == 2.0 and terms["vLLM worker asleep"] == 1.0
    assert sum(terms.values()) == pytest.approx(79.7, abs=0.05)


def test_engines_take_their_share_of_the_whole_device_beside_the_offloaded_policy() -> None:
    terms = _terms("engines awake, generating")
    assert terms["vLLM (gpu_memory_utilization x whole device)"] == pytest.approx(0.6 * H200_GIB)  # 84.24
    assert "policy gradient buffer (fp32)" not in terms and not any(k.startswith("optimizer states") for k in terms)
    assert sum(terms.values()) == pytest.approx(LOCAL * 2 / GIB + 2.0 + 0.6 * H200_GIB)  # 100.0


def test_weight_sync_holds_two_embedding_sized_buckets_on_each_side() -> None:
    terms = _terms("weight sync")
    bucket = (EMBEDDING + 5120) * 2 / GIB  # the largest bucket, the output layer with the final norm: 1.45 GiB > 64 MiB
    assert terms["weight-sync send buffers"] == pytest.approx(4 * bucket)
    assert terms["weight-sync receive buffers (outside vLLM's budget)"] == pytest.approx(2 * bucket)


def test_without_offload_or_empty_cache_the_14b_generation_phase_is_refused() -> None:
    kept = replace(LAYOUT, offload_grads=False, offload_optimizer=False, empty_cache=False)
    terms = _terms("engines awake, generating", kept)
    # The allocator keeps the update's whole peak (79.7 GiB less the sleeping engine's 1).
    assert terms["policy reserved at the update's peak"] == pytest.approx(78.7, abs=0.05)
    problems = plan_layout(MODEL, kept).problems
    assert any(p.startswith("engines awake, generating: 163.0 GiB does not fit in 90% of H200's 140.4 GiB") for p in problems)
    # Emptying the cache alone is not enough either: gradients + Adam stay (13.75 + 27.51 + 2.58 + 2 + 84.24).
    cache_only = replace(kept, empty_cache=True)
    assert sum(_terms("engines awake, generating", cache_only).values()) == pytest.approx(130.1, abs=0.05)
    assert not plan_layout(MODEL, cache_only).fits


def test_without_sequence_parallelism_the_norm_activations_are_not_divided() -> None:
    on = _terms("policy update")["activations (40 layers, 1F1B)"]
    off = _terms("policy update", replace(LAYOUT, sequence_parallel=False))["activations (40 layers, 1F1B)"]
    assert off - on == pytest.approx(6144 * 40 * (2 * (4 * 5120 / 2) + 4 * (2 - 2 / 2)) / GIB)


def test_unchunked_log_probs_hold_three_fp32_copies_of_the_whole_micro_batch() -> None:
    terms = _terms("policy update", replace(LAYOUT, logprob_chunk_tokens=None))
    assert terms["log-prob chunk temporaries (fp32)"] == pytest.approx(3 * 6144 * 75968 * 4 / GIB)  # 5.2


def test_host_memory_holds_the_offloaded_adam_state_and_at_sleep_level_1_the_engines_weights_pinned() -> None:
    terms = {t.name: t.gib for t in plan_layout(MODEL, LAYOUT).host.terms}
    assert "vLLM weights asleep (pinned)" not in terms  # sleep level 2 (rollout.config.SLEEP_LEVEL) keeps no copy
    level1 = replace(LAYOUT.memory_inputs(), sleep_level=1)
    pinned = {t.name: t.gib for t in mm.host_phase(MODEL, level1, 8, 8, 8).terms}
    assert pinned["vLLM weights asleep (pinned)"] == pytest.approx(8 * MODEL.total_params * 2 / 2 / GIB)
    assert terms["optimizer state offloaded (while generating)"] == pytest.approx(8 * LOCAL * 12 / 32 / GIB)
    assert terms["processes"] == 16 * 4.0


@pytest.mark.parametrize(("name", "nodes"), [("qwen2.5_math_1.5b", 1), ("qwen3_4b", 2), ("qwen3_8b", 4), ("qwen3_14b", 8)])
def test_paper_configs_leave_ten_percent_in_every_phase(name: str, nodes: int) -> None:
    from megatron_pc.launch.plan import _parser, layout_from_args

    model, layout = layout_from_args(_parser().parse_args([name, "--nodes", str(nodes)]))
    report = plan_layout(model, layout)
    assert report.fits, report.problems
    for phase in report.phases:
        assert phase.total <= 0.9 * layout.device.total_gib, phase.name


def test_sync_buckets_are_those_buckets_by_layer_cuts_from_the_export_order() -> None:
    import torch

    from megatron_pc.weight_sync.buckets import buckets_by_layer

    model = KNOWN_MODELS["Qwen3-14B"]
    units = mm.sync_units(model)
    names = ["model.embed_tokens.weight", *[f"model.layers.{k}.mlp.down_proj.weight" for k in range(model.layers)],
             "model.norm.weight", "lm_head.weight"]  # fmt: skip
    tensors = [(n, torch.empty(b // 2, dtype=torch.bfloat16, device="meta")) for n, b in zip(names, units)]
    for mb in (64, 853, 4096):
        real = [sum(t.numel() * 2 for _, t in bucket) for bucket in buckets_by_layer(tensors, mb * 2**20)]
        assert real == mm.sync_buckets(model, mb), mb


@pytest.mark.parametrize(("name", "nodes"), [("qwen2.5_math_1.5b", 1), ("qwen3_4b", 2), ("qwen3_8b", 4), ("qwen3_14b", 8)])
def test_paper_configs_take_the_largest_buckets_no_larger_than_the_embedding(name: str, nodes: int) -> None:
    from megatron_pc.launch.plan import _parser, layout_from_args

    model, layout = layout_from_args(_parser().parse_args([name, "--nodes", str(nodes)]))
    mb = mm.bucket_mb_within_largest_unit(model)
    assert layout.sync_bucket_mb == mb
    largest = max(mm.sync_buckets(model, 64))  # the output layer (or embedding) with the norm
    assert max(mm.sync_buckets(model, mb)) == largest  # the sync's buffers stay what they were at 64 MiB
    assert max(mm.sync_buckets(model, mb + model.layer_params * 2 // 2**20)) > largest  # one layer more would grow them
    assert len(mm.sync_buckets(model, mb)) < len(mm.sync_buckets(model, 64)) / 1.9
