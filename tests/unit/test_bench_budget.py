"""bench rollouts at equal budgets: the settings every run gets (budget, rollout schedule, the
paper's shape), the strategies it runs, the multi-epoch regime's check, the finished-run test
and the cost estimate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import strategies as bench
from benchmarks.shapes import SHAPES, parse_shape
from megatron_pc.analysis.regimes import REGIMES
from megatron_pc.config import load_config
from megatron_pc.errors import MegatronPCError

REPO = Path(__file__).resolve().parents[2]
CONFIG = str(REPO / "configs" / "tiny_cpu.yaml")


def _jobs(tmp_path: Path, *flags: str) -> tuple[object, dict[str, bench.Job]]:
    args = bench._parser().parse_intermixed_args([CONFIG, "--regimes", "paper_like", "--seeds", "1", "--out", str(tmp_path),
                                                  "--variants", "none", "--ablations", "none", *flags])  # fmt: skip
    regimes, strategies, variants, _ = bench._check_args(args)
    return args, {j.label: j for j in bench.labelled_jobs(args, regimes[0], tmp_path, strategies, variants)}


def test_a_budget_runs_every_allocator_in_the_papers_shape_until_it_has_spent_the_budget(tmp_path: Path) -> None:
    args, jobs = _jobs(tmp_path, "--budget", "40960")
    assert list(jobs) == ["pilot_commit", "grpo", "dapo", "speed_rl", "greso", "mopps"]
    assert args.validate_every_rollouts == 40960 // 8 and args.val_size == 18000 and args.shape.name == "paper64"
    assert args.steps == bench.BUDGET_DEFAULTS["step_cap"]  # a cap that never binds: the budget ends each run
    for label, job in jobs.items():
        cfg = load_config(CONFIG, list(job.overrides))
        assert cfg.allocation.strategy == label
        assert (cfg.training.rollout_budget, cfg.training.validate_every_rollouts) == (40960, 5120)
        assert (cfg.allocation.n, cfg.allocation.pilot.n, cfg.allocation.commit_rollouts, cfg.allocation.train_batch) == (64, 16, 48, 8)
        assert cfg.allocation.pilot.batch == 24 and cfg.allocation.buffer.sampling == "random" and cfg.allocation.buffer.age_rule == "reference"
    # The paper's band and eviction at that shape are the defaults.
    cfg = load_config(CONFIG, list(jobs["pilot_commit"].overrides))
    assert (cfg.allocation.p_lower, cfg.allocation.p_upper, cfg.allocation.p_evict, cfg.allocation.buffer.max_age) == (0.125, 0.75, 1.0, 4)


def test_without_a_budget_the_older_step_matched_design_is_unchanged(tmp_path: Path) -> None:
    args, jobs = _jobs(tmp_path)
    assert list(jobs) == ["pilot_commit", "grpo", "dapo"] and args.shape.name == "small" and args.steps == 70 and args.val_size == 640
    cfg = load_config(CONFIG, list(jobs["grpo"].overrides))
    assert cfg.training.rollout_budget is None and cfg.training.validate_every_rollouts is None
    assert (cfg.allocation.n, cfg.allocation.pilot.n, cfg.allocation.train_batch) == (16, 4, 32)
    with pytest.raises(MegatronPCError, match="--validate-every-rollouts: only with --budget"):
        _jobs(tmp_path, "--validate-every-rollouts", "100")


def test_every_shape_is_a_valid_configuration_of_every_strategy() -> None:
    for shape in SHAPES.values():
        for strategy in bench.ALL_STRATEGIES:
            cfg = load_config(CONFIG, [*shape.overrides(), f"allocation.strategy={strategy}"])
            assert cfg.allocation.n == shape.n and shape.grpo_step_rollouts == 512
    with pytest.raises(MegatronPCError, match="--shape: unknown 'paper32'"):
        parse_shape("paper32")


def test_the_multi_epoch_regime_refuses_a_budget_of_fewer_than_three_grpo_epochs(tmp_path: Path) -> None:
    regime = REGIMES["multi_epoch"]
    args = bench._parser().parse_intermixed_args([CONFIG, "--regimes", "multi_epoch", "--budget", "36864", "--out", str(tmp_path)])
    bench._check_args(args)
    base = bench._base_overrides(args, regime, tmp_path / "validation.jsonl")
    cfg = load_config(CONFIG, base)
    assert cfg.data.train_size == regime.train_size == 192
    bench.check_epochs(args, regime, cfg)  # 36,864 = 3 x 192 x 64
    args.budget = 36863
    with pytest.raises(MegatronPCError, match="needs >= 3 \\(a budget of at least 36,864\\)"):
        bench.check_epochs(args, regime, cfg)


def test_a_run_is_finished_once_its_checkpointed_steps_spent_the_budget(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "val_accuracy": 0.1}] + [{"step": s, "generated": 500, "cum_generated": 500 * s} for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert bench.finished_rollouts(run) == 1500  # kept without checkpoints: every logged step counts


def test_the_budget_estimate_counts_the_steps_each_strategy_needs_to_spend_it() -> None:
    summary = {"regimes": {"hard": {"strategies": {"grpo": {"rollouts_per_step": 512, "step_seconds": 2.0, "validation_seconds": 10.0},
                                                   "pilot_commit": {"rollouts_per_step": 1024, "step_seconds": 3.0, "validation_seconds": 10.0}}}}}  # fmt: skip
    out = bench.estimate_budget_seconds(summary, startup=50.0, budget=5120, every=1024, seeds=1, val_scale=2.0)
    # GRPO: 10 steps x 2 s + 7 validations x 20 s + 50; PC: 5 x 3 + 140 + 50.
    assert out["hard"] == pytest.approx((20 + 140 + 50) + (15 + 140 + 50)) and out["total"] == out["hard"]
