"""The simulator's fitted learning model: the scale, the fit, and the simulator using it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml

from megatron_pc.allocation import Rollout, TrainGroup
from megatron_pc.analysis.learning_model import PARAMS_FILE, FittedLearning, SkillScale, load_fitted
from megatron_pc.analysis.runs import Run
from megatron_pc.analysis.simulate import SimConfig, SimulatedPolicy, step_updates
from megatron_pc.analysis.simulate_fit import Group, fit, load_groups, predicted_accuracy, trajectory
from megatron_pc.cli import main
from megatron_pc.config import load_config

RATES = [0.0, 0.0625, 0.25, 0.5, 0.5, 0.75, 0.9375, 1.0, 0.125, 0.375]
TRUE = FittedLearning(scale=0.03, updates_exp=0.9, groups_exp=0.4, variance_exp=-0.5, saturation=0.3)


def _rows(updates: float, groups: int, z: float, variance: float, steps: int, seed: int) -> list[dict]:
    """Metrics rows of a run whose allocation figures wobble step to step (deterministically)."""
    rng = np.random.default_rng(seed)
    rows = [{"step": 0, "val_accuracy": 0.0}]
    for step in range(1, steps + 1):
        zs = float(np.clip(z + rng.normal(0, 0.05), 0, 0.95))
        rows.append({"step": step, "generated": 512, "cum_generated": 512 * step, "updates": updates, "batch_groups": groups,
                     "zero_variance_share": zs, "group_reward_var_mean": variance * (1 - zs) * (1 + rng.normal(0, 0.1)),
                     "val_accuracy": 0.0 if step % 5 == 0 else None})  # fmt: skip
    return rows


def _synthetic_group(model: FittedLearning) -> Group:
    """Runs under several update counts, batches and variances whose accuracies follow ``model`` exactly."""
    scale = SkillScale(RATES, 16)
    group = Group("bench/mixed", "bench", "mixed", scale, RATES, 16, float(scale.skill(0.45)), [])
    specs = [(1, 32, 0.0, 0.18), (1, 32, 0.4, 0.14), (4, 32, 0.4, 0.14), (6, 32, 0.0, 0.17), (1, 16, 0.7, 0.12), (4, 32, 0.0, 0.15)]
    for i, (updates, groups, z, variance) in enumerate(specs):
        rows = [{k: v for k, v in r.items() if v is not None} for r in _rows(updates, groups, z, variance, 60, i)]
        run = Run("mixed", f"s{i}", 0, Path(f"s{i}"), rows)
        t = trajectory(run, group.name)
        accuracy = predicted_accuracy(model, group, t)
        for row in rows:
            if "val_accuracy" in row and row["step"] > 0:
                row["val_accuracy"] = float(accuracy[list(t.val_steps).index(row["step"])])
            elif row["step"] == 0:
                row["val_accuracy"] = 0.45
        group.trajectories.append(trajectory(Run("mixed", f"s{i}", 0, Path(f"s{i}"), rows), group.name))
    return group


def test_fit_recovers_the_parameters_that_made_the_trajectories() -> None:
    group = _synthetic_group(TRUE)
    fitted, rmse = fit([group], fixed={})
    assert rmse < 1e-5
    for name, true in TRUE.as_dict().items():
        assert getattr(fitted, name) == pytest.approx(true, rel=0.02, abs=0.01), name


def test_fit_is_deterministic_and_keeps_a_fixed_parameter() -> None:
    group = _synthetic_group(TRUE)
    fitted, rmse = fit([group], fixed={"variance_exp": 0.0})
    assert (fitted, rmse) == fit([group], fixed={"variance_exp": 0.0})
    assert fitted.variance_exp == 0.0 and rmse > 1e-4  # the data were made with -0.5


def test_skill_scale_maps_accuracy_to_skill_and_back() -> None:
    scale = SkillScale(RATES, 16)
    assert float(scale.accuracy(0.0)) == pytest.approx(np.mean(RATES), abs=0.03)
    for acc in (0.1, 0.45, 0.8):
        assert float(scale.accuracy(scale.skill(acc))) == pytest.approx(acc, abs=1e-4)
    assert np.all(np.diff(scale.accuracy(np.linspace(-5, 5, 50))) > 0)


def test_fitted_step_gain_grows_less_than_linearly_with_groups_and_slows_with_updates_taken() -> None:
    model = FittedLearning(0.03, 1.0, 0.4, 0.0, 0.3)
    one, double = model.step_gain(1, 16, 0.2, 1), model.step_gain(1, 32, 0.2, 1)
    assert one < double < 2 * one
    assert model.step_gain(1, 16, 0.2, 100) < one
    assert model.step_gain(4, 0, 0.2, 4) == 0.0


def test_step_updates_follow_the_trainers_split() -> None:
    groups = [TrainGroup(i, [Rollout(1.0, True)] * 16, step=1) for i in range(32)]
    equal = load_config(None, ["training.mini_batch=8"])
    assert step_updates(equal, equal.allocation, groups) == 4
    ref = load_config(None, ["training.mini_batch=8", "training.mini_batch_unit=call_rollouts", "allocation.strategy=grpo"])
    assert step_updates(ref, ref.allocation, groups) == 4  # 512 rows in mini-batches of 8 x 16
    pc = load_config(None, ["training.mini_batch=8", "training.mini_batch_unit=call_rollouts", "allocation.strategy=pilot_commit"])
    assert step_updates(pc, pc.allocation, groups) == 6  # 512 rows in mini-batches of 8 x 12 (its commit n)


def test_fitted_policy_learns_only_from_informative_groups() -> None:
    sim = SimConfig(pool_size=10, validation_size=50, learning="fitted", fitted=TRUE)
    policy = SimulatedPolicy(sim, seed=0)
    before = policy.validation_accuracy()
    policy.train([TrainGroup(i, [Rollout(1.0, True)] * 4, step=1) for i in range(4)], updates=1)
    assert policy.validation_accuracy() == before
    policy.train([TrainGroup(i, [Rollout(1.0, True), Rollout(0.0, False)] * 2, step=1) for i in range(4)], updates=1)
    assert policy.validation_accuracy() > before


def test_committed_parameters_load_with_their_held_out_error() -> None:
    model, record = load_fitted(PARAMS_FILE)
    assert model.scale > 0 and 0 < model.groups_exp < 1
    assert record["held_out"]["seed"]["ratios"] > 0 and record["command"].startswith("megatron-pc fit-simulator")


def test_simulate_states_its_learning_model_and_error(capsys) -> None:
    args = ["simulate", "--seeds", "1", "--pool-size", "600", "--max-steps", "5"]
    assert main([*args, "--target-accuracy", "0.3"]) == 0
    out = capsys.readouterr().out
    assert "learning model: fitted" in out and "held-out error" in out and "fewest rollouts to the target:" in out
    assert main([*args, "--learning", "linear"]) == 0
    assert "learning model: linear" in capsys.readouterr().out


def test_simulate_refuses_lr_without_the_linear_model(capsys) -> None:
    assert main(["simulate", "--lr", "0.02"]) == 2
    assert "--lr" in capsys.readouterr().err


def test_simulate_refuses_unreadable_learning_parameters(tmp_path, capsys) -> None:
    bad = tmp_path / "params.json"
    bad.write_text(json.dumps({"params": {"scale": 1.0}}))
    assert main(["simulate", "--learning-params", str(bad)]) == 2
    assert "--learning-params" in capsys.readouterr().err


def test_fit_refuses_a_regime_without_its_calibration(tmp_path) -> None:
    run = tmp_path / "bench" / "mixed" / "grpo" / "seed_0"
    run.mkdir(parents=True)
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in _rows(1, 32, 0.3, 0.14, 5, 0)) + "\n")
    (run / "config.yaml").write_text(yaml.safe_dump({"allocation": {"strategy": "grpo"}}))
    (run.parent / "seed_0.wall.json").write_text("{}")
    with pytest.raises(Exception, match="success_rates.json"):
        load_groups([str(tmp_path / "bench")])


def _bench(root: Path) -> Path:
    """A small benchmark layout: PC and GRPO, 2 seeds, 10 steps, with its calibration."""
    regime = root / "bench" / "mixed"
    regime.mkdir(parents=True)
    (regime / "success_rates.json").write_text(json.dumps({"rates": RATES, "samples": 16}))
    for label, z in (("pilot_commit", 0.0), ("grpo", 0.4)):
        for seed in range(2):
            run = regime / label / f"seed_{seed}"
            run.mkdir(parents=True)
            rows = _rows(1, 32, z, 0.15, 10, seed)
            for row in rows:
                if row["val_accuracy"] is not None:
                    row["val_accuracy"] = 0.45 + 0.01 * row["step"] * (1.2 if label == "pilot_commit" else 1.0)
            (run / "metrics.jsonl").write_text("\n".join(json.dumps({k: v for k, v in r.items() if v is not None}) for r in rows) + "\n")
            cfg = {"allocation": {"strategy": label}, "data": {"train_size": 800},
                   "training": {"steps": 10, "validate_every": 5, "mini_batch": 32}}  # fmt: skip
            (run / "config.yaml").write_text(yaml.safe_dump(cfg))
            (regime / label / f"seed_{seed}.wall.json").write_text("{}")
    return root / "bench"


def test_fit_simulator_writes_parameters_and_prints_the_held_out_table(tmp_path, capsys) -> None:
    out = tmp_path / "params.json"
    assert main(["fit-simulator", str(_bench(tmp_path)), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "fitted, a seed held out: mean |error|" in text and "grpo/PC" in text
    model, record = load_fitted(out)
    assert model.scale > 0 and {r["fold"] for r in record["table"]} >= {"seed 0", "seed 1"}
    assert "held-out error" in record["summary"]


def _budget_bench(root: Path, budget: int | dict[str, int] = 5120) -> Path:
    """The small layout as an equal-budget benchmark: every run stops once it has spent ``budget``
    rollouts (GRPO 512 a step, PC 1,024), validated after each step that crosses a multiple of 1,024."""
    bench = _bench(root)
    for cfg_path in bench.glob("mixed/*/seed_*/config.yaml"):
        label = cfg_path.parent.parent.name
        per_step = 1024 if label == "pilot_commit" else 512
        spend = budget[label] if isinstance(budget, dict) else budget
        rows = [{"step": 0, "cum_generated": 0, "val_accuracy": 0.45}]
        for step in range(1, spend // per_step + 1):
            z = 0.0 if label == "pilot_commit" else 0.4
            row = {"step": step, "generated": per_step, "cum_generated": per_step * step, "updates": 1, "batch_groups": 32,
                   "zero_variance_share": z, "group_reward_var_mean": 0.15 * (1 - z)}  # fmt: skip
            if (per_step * step) % 1024 == 0:
                row["val_accuracy"] = 0.45 + 0.004 * per_step * step / 512
            rows.append(row)
        (cfg_path.parent / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
        cfg = yaml.safe_load(cfg_path.read_text())
        cfg["training"].update(steps=100_000, rollout_budget=spend, validate_every_rollouts=1024)
        cfg_path.write_text(yaml.safe_dump(cfg))
    return bench


def test_an_equal_budget_benchmark_is_refit_and_judged_at_its_budget(tmp_path, capsys) -> None:
    from megatron_pc.analysis.simulate_fit import ratios, simulated_runs

    groups = load_groups([str(_budget_bench(tmp_path))])
    assert [g.budget for g in groups] == [5120]
    model, _ = fit(groups)
    simulated = simulated_runs(groups[0], "fitted", model, seeds=1)
    for run in simulated:  # the simulator stops at the step that spends the budget and validates on the same schedule
        generated = [r["cum_generated"] for r in run.rows]
        assert generated[-2] < 5120 <= generated[-1]
        validated = [r["cum_generated"] for r in run.rows if "val_accuracy" in r]
        crossings = [g for prev, g in zip(generated, generated[1:]) if g // 1024 > prev // 1024]
        assert validated == [0, *crossings] or validated == [0, *crossings, generated[-1]]
    measured = ratios([t.run for t in groups[0].trajectories], 5120)
    assert set(measured) == {"grpo"} and len(measured["grpo"]) == 3
    out = tmp_path / "params.json"
    assert main(["fit-simulator", str(tmp_path / "bench"), "--out", str(out)]) == 0
    assert "grpo/PC" in capsys.readouterr().out


def test_runs_of_one_regime_that_spent_different_budgets_are_refused(tmp_path) -> None:
    bench = _budget_bench(tmp_path, {"pilot_commit": 5120, "grpo": 4096})
    with pytest.raises(Exception, match="different rollout budgets"):
        load_groups([str(bench)])


def test_judge_predicts_runs_the_parameters_were_not_fitted_on_and_refuses_seen_ones(tmp_path, capsys) -> None:
    out = tmp_path / "params.json"
    fitted_on = _budget_bench(tmp_path / "a")
    assert main(["fit-simulator", str(fitted_on), "--out", str(out)]) == 0
    written = out.read_text()
    capsys.readouterr()
    assert main(["fit-simulator", str(fitted_on), "--judge", str(out)]) == 2
    assert "was fitted on bench/mixed; judge it on runs it has not seen" in capsys.readouterr().err
    unseen = _budget_bench(tmp_path / "b").rename(tmp_path / "b" / "later")
    assert main(["fit-simulator", str(unseen), "--judge", str(out)]) == 0
    text = capsys.readouterr().out
    assert "on 4 unseen runs (later/mixed): accuracy rms error" in text
    assert "unseen runs" in text and "grpo/PC" in text and "predicting unseen runs: mean |error|" in text
    assert out.read_text() == written  # judging writes nothing
    assert main(["fit-simulator", str(unseen), "--judge", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
