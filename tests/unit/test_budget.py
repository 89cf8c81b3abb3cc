"""Equal-budget comparisons (megatron_pc.analysis.budget): the paired statistic with its interval
and tie rule, accuracy at fixed spends, the targets' rule, and the validation's precision check;
and the report that carries them."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from megatron_pc.analysis.budget import (accuracy_at, accuracy_at_budgets, budget_targets, paired_ratio, per_seed_ratios,
                                         prompts_needed, validation_precision, verdict_words)
from megatron_pc.analysis.report import write_report
from megatron_pc.analysis.runs import Point, Run


def _rows(accuracies: list[float], per_step: int, every: int = 5) -> list[dict]:
    rows: list[dict] = [{"step": 0, "val_accuracy": accuracies[0], "val_accuracy_stderr": 0.01}]
    for step in range(1, every * (len(accuracies) - 1) + 1):
        row = {"step": step, "generated": per_step, "cum_generated": per_step * step, "time_total": 1.0, "zero_variance_share": 0.5}
        if step % every == 0:
            row.update(val_accuracy=accuracies[step // every], val_accuracy_stderr=0.01)
        rows.append(row)
    return rows


def _run(strategy: str, accuracies: list[float], per_step: int, seed: int = 0) -> Run:
    return Run("mixed", strategy, seed, Path(f"/runs/{strategy}/{seed}"), _rows(accuracies, per_step), val_prompts=400, val_samples=4)


def test_the_statistic_is_the_median_of_paired_per_seed_ratios() -> None:
    r = paired_ratio({"0": 300.0, "1": 100.0, "2": 500.0}, {"0": 100.0, "1": 200.0, "2": 250.0})
    # Per seed 3.0, 0.5, 2.0: the median is 2.0, not the ratio of medians (300 / 200 = 1.5).
    assert r["ratio"] == pytest.approx(2.0) and r["pairs"] == 3
    assert r["ci_low"] <= r["ratio"] <= r["ci_high"] and r["verdict"] == "tie"  # 0.5 .. 3.0 straddles 1
    assert "tie" in verdict_words(r, "grpo")


def test_an_interval_above_one_says_the_reference_needs_fewer() -> None:
    r = paired_ratio({str(s): 150.0 + s for s in range(5)}, {str(s): 100.0 for s in range(5)})
    assert r["verdict"] == "other_more" and r["ci_low"] > 1.0
    assert verdict_words(r, "grpo").startswith("PC needs fewer")
    less = paired_ratio({str(s): 50.0 for s in range(5)}, {str(s): 100.0 + s for s in range(5)})
    assert less["verdict"] == "other_less" and verdict_words(less, "grpo").startswith("grpo needs fewer")


def test_a_miss_is_an_infinite_or_zero_ratio_and_a_double_miss_is_left_out() -> None:
    assert per_seed_ratios({"0": None, "1": 100.0, "2": None}, {"0": 100.0, "1": None, "2": None}) == {"0": math.inf, "1": 0.0}
    r = paired_ratio({"0": None, "1": None, "2": 100.0}, {"0": 100.0, "1": 100.0, "2": 100.0})
    assert r["status"] == "reference_only" and r["ratio"] is None and r["ci_high"] is None and r["ci_high_unbounded"]
    assert paired_ratio({"0": None}, {"0": None})["verdict"] is None


def test_accuracy_at_a_spend_interpolates_between_validations_and_is_none_past_the_run() -> None:
    points = [Point(0, 0, 0, 0.40, None), Point(5, 500, 5, 0.44, None), Point(10, 1000, 10, 0.48, None)]
    assert accuracy_at(points, 250) == pytest.approx(0.42)
    assert accuracy_at(points, 1000) == pytest.approx(0.48)
    assert accuracy_at(points, 1001) is None


def test_targets_are_fractions_of_the_median_gain_at_the_budget_whichever_strategy_is_worst() -> None:
    # At 1,000 rollouts: PC +0.08, GRPO +0.04, DAPO +0.02 -> the median gain is GRPO's 0.04.
    runs = [_run("pilot_commit", [0.40, 0.44, 0.48], 100), _run("grpo", [0.40, 0.42, 0.44], 100), _run("dapo", [0.40, 0.41, 0.42], 100)]
    chosen = budget_targets(runs, 1000, (0.5, 1.0))
    assert chosen["gain_used"] == pytest.approx(0.04) and chosen["target_accuracies"] == pytest.approx([0.42, 0.44])
    # A worse worst strategy does not move the targets.
    worse = runs[:2] + [_run("dapo", [0.40, 0.40, 0.40], 100)]
    assert budget_targets(worse, 1000, (0.5, 1.0))["target_accuracies"] == pytest.approx([0.42, 0.44])
    # A strategy that stopped short of the budget has no gain at it and is named.
    short = runs[:2] + [_run("dapo", [0.40, 0.41], 100)]
    assert budget_targets(short, 1000, (0.5,))["strategies_short_of_budget"] == ["dapo"]


def test_accuracy_at_budgets_gives_each_spend_with_the_seed_band() -> None:
    runs = [_run("grpo", [0.40, 0.42, 0.44], 100, seed=0), _run("grpo", [0.40, 0.44, 0.46], 100, seed=1)]
    rows = accuracy_at_budgets(runs, 1000)["grpo"]
    assert [r["share"] for r in rows] == [0.25, 0.5, 0.75, 1.0]
    assert rows[1]["median"] == pytest.approx(0.43) and (rows[1]["min"], rows[1]["max"]) == pytest.approx((0.42, 0.44))


def test_validation_precision_compares_the_stderr_with_a_third_of_the_smallest_target_gap() -> None:
    runs = [_run("pilot_commit", [0.40, 0.44, 0.48], 100), _run("grpo", [0.40, 0.42, 0.44], 100)]
    p = validation_precision(runs, budget_targets(runs, 1000, (0.25, 0.5, 0.75)))
    # Median gain 0.06; targets 0.015 apart; stderr 0.01 is not under 0.005.
    assert p["smallest_gap"] == pytest.approx(0.015) and p["stderr"] == pytest.approx(0.01) and p["ok"] is False
    assert p["prompts_needed"] == prompts_needed(p["stderr"], 400, p["smallest_gap"]) and 1600 <= p["prompts_needed"] <= 1601  # 400 x (0.03 / 0.015)^2


def test_a_budget_report_shows_accuracy_at_spends_intervals_and_records_the_design(tmp_path: Path) -> None:
    runs = [_run(name, accs, per_step, seed) for seed in range(3) for name, accs, per_step in
            (("pilot_commit", [0.40, 0.46, 0.50], 100), ("grpo", [0.40, 0.43, 0.46], 100))]  # fmt: skip
    summary = write_report(runs, tmp_path, fractions=(0.25, 0.5), budget=1000)
    report = (tmp_path / "report.md").read_text()
    assert "Validation accuracy at fixed spends (budget R = 1,000 rollouts" in report and "Validation precision:" in report
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["budget"] == 1000 and "paired per-seed ratios" in saved["statistic"] and "median over strategies" in saved["target_rule"]
    grpo = summary["regimes"]["mixed"]["targets"][0]["strategies"]["grpo"]["vs_pilot_commit"]["rollouts"]
    assert {"ci_low", "ci_high", "verdict", "per_seed"} <= set(grpo)
