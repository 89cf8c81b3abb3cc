"""The cluster planner (`megatron-pc plan`): layout checks, memory estimates, refusals."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from megatron_pc.cli import main as cli_main
from megatron_pc.cluster.config import ClusterConfig
from megatron_pc.launch import memory_model as mm
from megatron_pc.models.shapes import KNOWN_MODELS, load_model_shape
from megatron_pc.launch.plan import Layout, plan_layout
from megatron_pc.errors import ConfigError

QWEN3_14B_YAML = """\
name: qwen3_14b_pc
model: {path: Qwen3-14B, tensor_parallel: 2, pipeline_parallel: 1, params_dtype: bfloat16}
cluster: {placement: colocated, data_parallel: 32}
rollout: {engines: 32, tensor_parallel: 2, gpu_memory_utilization: 0.5, max_tokens: 8192, max_model_len: 9216}
training: {micro_batch_tokens: 8192}
"""

# The same 14B layout as a plain Layout, for the pure function.
LAYOUT_14B = Layout(
    nodes=8, gpus_per_node=8, device=mm.DEVICES["H200"], placement="colocated",
    tensor_parallel=2, pipeline_parallel=1, data_parallel=32, engines=32, engine_tensor_parallel=2,
    gpu_memory_utilization=0.5, micro_batch_tokens=8192, sequence_tokens=9216,
)  # fmt: skip


@pytest.fixture
def config_14b(tmp_path: Path) -> Path:
    path = tmp_path / "qwen3_14b.yaml"
    path.write_text(QWEN3_14B_YAML)
    return path


def plan(config: Path, *args: str) -> int:
    return cli_main(["plan", str(config), "--no-data-check", *args])


def test_qwen3_14b_colocated_on_8_nodes_of_8_h200_fits_and_prints_the_plan(config_14b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plan(config_14b, "--nodes", "8", "--gpus-per-node", "8") == 0
    out, err = capsys.readouterr()
    assert "Qwen3-14B: 14.77B parameters" in out
    assert "TP=2 PP=1 DP=32 = 64 GPUs" in out
    assert "32 x TP=2 = 64 GPUs" in out
    for phase in ("policy update", "old log-probs", "engines awake, generating", "weight sync", "sync check", "host memory per node"):
        assert f"\n{phase}: " in out, phase
    assert "H200: 140.4 GiB as torch reports it" in out
    assert out.rstrip().endswith("fits")
    assert err == ""


def test_tp1_pp1_with_replicated_optimizer_on_one_gpu_is_refused_naming_the_optimizer(config_14b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    overrides = ["model.tensor_parallel=1", "cluster.data_parallel=1", "rollout.engines=1", "rollout.tensor_parallel=1"]
    assert plan(config_14b, "--nodes", "1", "--gpus-per-node", "1", "--no-distributed-optimizer", *overrides) == 2
    out, err = capsys.readouterr()
    assert "REFUSED" in out
    # 14.77B parameters on one GPU: 12 B each of Adam state alone is 165 GiB.
    assert "policy update: 337.4 GiB does not fit in 90% of H200's 140.4 GiB = 126.4 GiB" in err
    assert "largest term: optimizer states (replicated) = 165.0 GiB" in err


def test_tp_not_dividing_kv_heads_is_refused_naming_them(config_14b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # TP=5 divides the 40 attention heads of Qwen3-14B but not its 8 KV heads.
    assert plan(config_14b, "--nodes", "8", "model.tensor_parallel=5") == 2
    err = capsys.readouterr().err
    assert "model.tensor_parallel=5 does not divide the 8 KV heads of Qwen3-14B" in err
    assert "attention heads" not in err


def test_gpu_memory_flag_refuses_the_14b_layout_on_80_gb_gpus(config_14b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 80 names the H100 (79.6 GiB): 0.5 of it for vLLM beside the policy's 14 GiB of weights fits,
    # but the update (activations of 8,192 tokens) does not.
    assert plan(config_14b, "--nodes", "8", "--gpu-memory-gb", "80") == 2
    err = capsys.readouterr().err
    assert "policy update: " in err and "does not fit in 90% of H100's 79.6 GiB = 71.7 GiB" in err


def test_colocated_policy_must_cover_every_gpu(config_14b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plan(config_14b, "--nodes", "4") == 2
    err = capsys.readouterr().err
    assert "colocated: policy TP x PP x DP = 2 x 1 x 32 = 64 GPUs, but the cluster has 4 x 8 = 32" in err
    assert "colocated: engines x engine TP = 32 x 2 = 64 GPUs" in err


def test_split_pools_fit_when_their_sum_fits_the_cluster() -> None:
    split = replace(LAYOUT_14B, placement="split", data_parallel=16, engines=16)
    report = plan_layout(KNOWN_MODELS["Qwen3-14B"], split)
    assert report.fits, report.problems
    assert [p.name for p in report.phases] == ["policy update", "old log-probs", "weight sync (policy GPU)", "sync check (policy GPU)",
                                              "engines generating (engine GPU)", "weight sync (engine GPU)"]
    over = plan_layout(KNOWN_MODELS["Qwen3-14B"], replace(split, engines=17))
    assert over.problems == ["split: policy TP x PP x DP = 2 x 1 x 16 = 32 GPUs + engines x engine TP = 17 x 2 = 34 GPUs = 66 GPUs, but the cluster has 8 x 8 = 64"]


def test_pipeline_parallel_must_divide_layers() -> None:
    layout = replace(LAYOUT_14B, pipeline_parallel=3, data_parallel=10, nodes=8)
    problems = plan_layout(KNOWN_MODELS["Qwen3-14B"], layout).problems
    assert "model.pipeline_parallel=3 does not divide the 40 layers of Qwen3-14B" in problems


def test_tensor_parallel_beyond_one_node_is_refused() -> None:
    # Qwen3-8B: 16 divides its 32 heads and is a multiple of its 8 KV heads; only the node limit bites.
    layout = replace(LAYOUT_14B, engine_tensor_parallel=16, engines=4)
    problems = plan_layout(KNOWN_MODELS["Qwen3-8B"], layout).problems
    assert problems == ["rollout.tensor_parallel=16 spans more than one node (8 GPUs per node)"]


def test_engine_tp_above_kv_heads_is_allowed_when_a_multiple_of_them() -> None:
    # vLLM replicates KV heads when engine TP exceeds them: Qwen2.5-Math-1.5B has 2 KV heads.
    model = KNOWN_MODELS["Qwen2.5-Math-1.5B"]
    assert plan_layout(model, replace(LAYOUT_14B, engine_tensor_parallel=4, engines=16)).fits
    assert plan_layout(model, replace(LAYOUT_14B, tensor_parallel=4, data_parallel=16)).problems == [
        "model.tensor_parallel=4 does not divide the 2 KV heads of Qwen2.5-Math-1.5B"
    ]


def test_vllm_weights_larger_than_its_memory_fraction_are_refused() -> None:
    layout = replace(LAYOUT_14B, engine_tensor_parallel=1, engines=64, gpu_memory_utilization=0.2)
    report = plan_layout(KNOWN_MODELS["Qwen3-14B"], layout)
    assert report.kv_cache_tokens == 0
    assert report.problems == [
        "vLLM weights (27.5 GiB per GPU at engine TP=1) + 2 GiB of activations and graphs do not fit in "
        "rollout.gpu_memory_utilization=0.2 x 140.4 GiB = 28.1 GiB"
    ]


def test_kv_cache_smaller_than_one_sequence_is_refused() -> None:
    layout = replace(LAYOUT_14B, engine_tensor_parallel=1, engines=64, gpu_memory_utilization=0.22, sequence_tokens=131072)
    problems = plan_layout(KNOWN_MODELS["Qwen3-14B"], layout).problems
    assert len(problems) == 1 and problems[0].startswith("vLLM KV cache holds ")
    assert "fewer than one sequence of rollout.max_model_len=131072 tokens" in problems[0]


def test_distributed_optimizer_divides_optimizer_states_by_data_parallel() -> None:
    model = KNOWN_MODELS["Qwen3-8B"]

    def optimizer_gib(layout: Layout) -> float:
        terms = plan_layout(model, layout).phases[0].terms
        return next(t.gib for t in terms if t.name.startswith("optimizer states"))

    sharded = optimizer_gib(LAYOUT_14B)
    replicated = optimizer_gib(replace(LAYOUT_14B, distributed_optimizer=False))
    assert replicated == pytest.approx(32 * sharded)
    # bf16 params: 12 bytes per local parameter (fp32 master + two moments), ~half the model per GPU at TP=2.
    assert replicated == pytest.approx(12 * model.total_params / 2 / 2**30, rel=0.02)


@pytest.mark.parametrize(
    ("name", "published_billions"),
    [("Qwen3-14B", 14.8), ("Qwen3-8B", 8.2), ("Qwen3-4B", 4.0), ("Qwen2.5-Math-1.5B", 1.54)],
)
def test_known_architectures_have_their_published_parameter_counts(name: str, published_billions: float) -> None:
    assert KNOWN_MODELS[name].total_params / 1e9 == pytest.approx(published_billions, rel=0.01)


def test_model_shape_is_read_from_config_json_when_the_path_exists(tmp_path: Path) -> None:
    config = {
        "num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
        "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True,
    }  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = load_model_shape(str(tmp_path))
    assert (shape.layers, shape.kv_heads, shape.head_dim, shape.tied_embeddings) == (30, 3, 64, True)


def test_known_architecture_is_found_by_exact_last_path_component_only() -> None:
    assert load_model_shape("Qwen/Qwen3-8B") is KNOWN_MODELS["Qwen3-8B"]
    with pytest.raises(ConfigError, match=r"model.path: 'Qwen3-8B-Instruct' has no config.json and is not a known"):
        load_model_shape("Qwen3-8B-Instruct")


def test_gpu_memory_gb_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="gpu_memory_gb: must be > 0"):
        ClusterConfig(gpu_memory_gb=0)


def test_without_max_model_len_the_engines_hold_the_models_own_limit(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """rollout.max_model_len unset (the tiny CPU default): the plan takes max_position_embeddings,
    as the vLLM engine does, instead of failing on a missing number."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "num_hidden_layers": 4, "hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 256, "vocab_size": 128, "max_position_embeddings": 96,
    }))  # fmt: skip
    config = tmp_path / "tiny.yaml"
    config.write_text(f"model: {{path: {model}}}\nrollout: {{max_model_len: null}}\n")
    assert plan(config, "--nodes", "1", "--gpus-per-node", "1") == 0
    assert "sequences of 96)" in capsys.readouterr().out


def test_plan_models_attention_per_layer_spec_and_refuses_what_needs_te(config_14b: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # No TE: auto is ours (no score matrix), and it fits.
    assert plan(config_14b, "--nodes", "8", "--no-te") == 0
    out, _ = capsys.readouterr()
    assert "model.layer_spec auto -> sdpa" in out and "Transformer Engine not installed" in out and "attention scores" not in out
    assert plan(config_14b, "--nodes", "8", "--te") == 0
    assert "model.layer_spec auto -> te" in capsys.readouterr().out
    # TE asked for where it is not: refused, naming TE and the two ways to get it.
    assert plan(config_14b, "--nodes", "8", "--no-te", "model.layer_spec=te") == 2
    err = capsys.readouterr().err
    assert "model.layer_spec=te needs Transformer Engine" in err and "docker/Dockerfile" in err and "install.sh --gpu" in err
    # Megatron's local spec: refused with SP; without SP its unfused score matrix does not fit.
    assert plan(config_14b, "--nodes", "8", "model.layer_spec=local") == 2
    assert "cannot run sequence parallelism" in capsys.readouterr().err
    assert plan(config_14b, "--nodes", "8", "model.layer_spec=local", "training.sequence_parallel=false") == 2
    err = capsys.readouterr().err
    assert "largest term: attention scores (40 layers, 1F1B, unfused: layer_spec local)" in err
    assert "use model.layer_spec=sdpa, or Transformer Engine; two ways to get it" in err
