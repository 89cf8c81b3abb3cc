"""The paper's reference runs in configs/ (PILOT_COMMIT.md): values, strategies, layouts, sbatch files."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from megatron_pc.cli import main as cli_main
from megatron_pc.config import Config, load_config, to_dict

REPO = Path(__file__).resolve().parents[2]
CONFIGS = REPO / "configs"


@dataclass(frozen=True)
class Reference:
    """What PILOT_COMMIT.md says about one reference run, and the cluster shape we give it."""

    model: str
    n: int
    pilot_n: int
    commit_n: int
    sbatch: str
    # node count -> overrides that fit that many nodes (the first is the config's own layout)
    layouts: dict[int, tuple[str, ...]]


PAPER = {
    "qwen2.5_math_1.5b": Reference("Qwen2.5-Math-1.5B", 128, 32, 96, "pc_1.5b",
                                   {1: (), 2: ("cluster.data_parallel=16", "rollout.engines=16")}),
    "qwen3_4b": Reference("Qwen3-4B", 64, 16, 48, "pc_4b",
                          {2: (), 4: ("cluster.data_parallel=32", "rollout.engines=32")}),
    "qwen3_8b": Reference("Qwen3-8B", 64, 16, 48, "pc_8b",
                          {4: (), 2: ("cluster.data_parallel=8", "rollout.engines=16")}),
    "qwen3_14b": Reference("Qwen3-14B", 64, 16, 48, "pc_14b", {8: ()}),
}  # fmt: skip
LAYOUTS = [(name, nodes, overrides) for name, ref in PAPER.items() for nodes, overrides in ref.layouts.items()]


def _load(name: str, *overrides: str) -> Config:
    return load_config(CONFIGS / f"{name}.yaml", overrides)


def test_configs_dir_holds_exactly_the_four_paper_runs_besides_tiny_cpu() -> None:
    assert {p.stem for p in CONFIGS.glob("qwen*.yaml")} == set(PAPER)


@pytest.mark.parametrize("name", PAPER)
def test_paper_config_has_the_reference_allocation(name: str) -> None:
    ref, cfg = PAPER[name], _load(name)
    a = cfg.allocation
    assert cfg.name == name
    assert a.strategy == "pilot_commit"
    assert (a.train_batch, a.n, a.pilot.n, a.pilot.batch) == (128, ref.n, ref.pilot_n, 384)
    assert a.pilot_kept == ref.pilot_n and a.commit_rollouts == ref.commit_n
    assert (a.p_lower, a.p_upper, a.p_evict) == (0.125, 0.75, 1.0)
    assert a.buffer.max_age == 4 and a.max_rounds == 10


@pytest.mark.parametrize("name", PAPER)
def test_paper_config_has_the_reference_optimizer_loss_and_sampling(name: str) -> None:
    cfg = _load(name)
    t, r = cfg.training, cfg.rollout
    assert (t.kl_coef, t.entropy_coef, t.loss_agg) == (0.0, 0.0, "token-mean")
    assert (t.clip_low, t.clip_high, t.dual_clip) == (0.2, 0.28, 10.0)
    assert (t.lr, t.warmup_steps, t.weight_decay, t.grad_clip, t.mini_batch) == (1e-6, 10, 0.1, 1.0, 32)
    assert (r.temperature, r.top_p, r.top_k) == (1.0, 1.0, -1)
    assert cfg.reward.function == "math_verify"
    assert cfg.data.source.endswith(".jsonl") and not cfg.data.source.startswith("builtin:")
    assert Path(cfg.model.path).name == PAPER[name].model


@pytest.mark.parametrize("name", PAPER)
def test_paper_config_lengths_hold_a_prompt_and_a_full_response(name: str) -> None:
    cfg = _load(name)
    r = cfg.rollout
    assert cfg.data.max_prompt_tokens + r.max_tokens <= r.max_model_len
    # Training packs whole sequences: one micro-batch must hold the longest.
    assert cfg.training.micro_batch_tokens >= r.max_model_len
    if name.startswith("qwen2.5_math"):
        assert r.max_model_len <= 4096  # Qwen2.5-Math's max_position_embeddings
    else:
        assert r.max_tokens == 16384


@pytest.mark.parametrize("strategy", ["pilot_commit", "grpo", "dapo"])
@pytest.mark.parametrize("name", PAPER)
def test_paper_config_validates_with_each_strategy_chosen_by_one_override(name: str, strategy: str) -> None:
    cfg = _load(name, f"allocation.strategy={strategy}")
    assert cfg.allocation.strategy == strategy
    assert cfg.allocation.n == PAPER[name].n  # same group size for the fair comparison


def _leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}{key}"
        out.update(_leaves(value, dotted + ".") if isinstance(value, dict) else {dotted: value})
    return out


@pytest.mark.parametrize("name", PAPER)
def test_paper_config_holds_only_fields_that_differ_from_the_defaults(name: str) -> None:
    written = _leaves(yaml.safe_load((CONFIGS / f"{name}.yaml").read_text()))
    defaults = _leaves(to_dict(Config()))
    same = [key for key, value in written.items() if defaults[key] == value]
    assert same == [], f"{name}.yaml repeats defaults: {same}"


@pytest.mark.parametrize(("name", "nodes", "overrides"), LAYOUTS)
def test_planner_accepts_paper_config_at_its_intended_node_count(
    name: str, nodes: int, overrides: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["plan", str(CONFIGS / f"{name}.yaml"), "--nodes", str(nodes), "--gpus-per-node", "8", *overrides]) == 0
    out, err = capsys.readouterr()
    assert f"cluster  {nodes} nodes x 8 GPUs" in out and out.rstrip().endswith("fits"), err
    # The engine count of this layout must split every strategy's rounds evenly (load validates it).
    for strategy in ("grpo", "dapo"):
        assert _load(name, *overrides, f"allocation.strategy={strategy}").allocation.strategy == strategy


@pytest.mark.parametrize("name", PAPER)
def test_sbatch_file_runs_its_config_on_the_node_count_the_config_plans_for(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    ref = PAPER[name]
    text = (REPO / "slurm" / f"{ref.sbatch}.sbatch").read_text()
    nodes = int(re.search(r"^#SBATCH --nodes=(\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    assert nodes == next(iter(ref.layouts))
    assert re.search(r"^#SBATCH --gpus-per-node=8$", text, re.M)
    assert re.search(rf'^exec bash "\$repo/slurm/bootstrap.sh" "\$repo/configs/{re.escape(name)}.yaml"$', text, re.M)
    assert cli_main(["plan", str(CONFIGS / f"{name}.yaml"), "--nodes", str(nodes)]) == 0
    capsys.readouterr()


def test_planner_refuses_the_14b_config_on_half_its_nodes(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["plan", str(CONFIGS / "qwen3_14b.yaml"), "--nodes", "4"]) == 2
    assert "colocated: policy TP x PP x DP = 2 x 1 x 32 = 64 GPUs, but the cluster has 4 x 8 = 32" in capsys.readouterr().err
