"""``megatron-pc report RUN_DIR...``: validation accuracy against rollouts, for any set of runs.

Each run directory is a normal training run (metrics.jsonl, config.yaml). Runs are grouped by
task (``data.source``) and strategy (``allocation.strategy``, or with ``--label-by dir`` the
name of the directory above the run, as in the layout ``megatron-pc bench rollouts`` writes);
their seeds form the spread. The report fixes target accuracies per task (the start plus 25 /
50 / 75% of the smallest final gain among the strategies), counts the rollouts and the training
seconds each run needed to first reach each of them, and compares every strategy with
Pilot-Commit. It writes DIR/report.md, DIR/summary.json and the PNG plots of
:mod:`megatron_pc.analysis.report_plots`; runs are read by :mod:`megatron_pc.analysis.runs`.

Conventions (also in docs/benchmarks.md):
* Start accuracy of a task: the mean step-0 validation accuracy of its runs (one start model).
* Final accuracy of a run: the mean of its last ``FINAL_POINTS`` validations after step 0 (less
  jitter than one).
* Reaching a target: the first validation at or above it, the rollouts (and seconds) linearly
  interpolated from the validation before it, so a check every 5 steps does not round to 5 steps.
* Seconds are training seconds: each step's ``time_total`` without its validation (the
  ``time_validation`` metric when present, else the step's excess over its timed phases).
* Medians over seeds count a run that never reached a target as infinitely slow, so a median
  exists when more than half of the seeds reached it.
* Ratios to a reference strategy: the median of the paired per-seed ratios with a bootstrap 90%
  interval; an interval that contains 1 is a tie (:mod:`megatron_pc.analysis.budget`).
* With ``--budget R`` (runs of equal rollout budget): targets are fractions of the median over
  strategies of their gains at R, and the accuracy at R/4, R/2, 3R/4 and R is reported.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any

from megatron_pc.analysis.budget import STATISTIC, accuracy_at_budgets, budget_targets, paired_ratio, validation_precision
from megatron_pc.analysis.report_format import markdown
from megatron_pc.analysis.report_plots import draw_all
from megatron_pc.analysis.runs import (MAIN_STRATEGIES, REFERENCE, VARIANT_REFERENCES, Point, Run, check_unique, load_run,
                                       relative_path, step_train_seconds, validation_seconds)
from megatron_pc.errors import MegatronPCError

TARGET_FRACTIONS = (0.25, 0.5, 0.75)
_NO_GAIN = 1e-9
"""A final gain this small is no gain (float noise of equal accuracies)."""

def first_reach(points: list[Point], target: float, axis: str) -> float | None:
    """``axis`` (``rollouts`` or ``seconds``) at which the accuracy first reaches ``target``,
    interpolated linearly from the validation before; None if it never does."""
    previous: Point | None = None
    for p in points:
        if p.accuracy >= target:
            x = getattr(p, axis)
            if previous is None or p.accuracy == previous.accuracy:
                return x
            share = (target - previous.accuracy) / (p.accuracy - previous.accuracy)
            return getattr(previous, axis) + share * (x - getattr(previous, axis))
        previous = p
    return None


def spread(values: dict[int, float | None]) -> dict[str, Any]:
    """Over seeds ({seed: value, None for a miss}): the median (a miss counts as infinitely slow),
    min and max of the hits, and how many seeds reached it."""
    hits = sorted(v for v in values.values() if v is not None)
    median = statistics.median([math.inf if v is None else v for v in values.values()]) if values else math.inf
    return {
        "median": None if math.isinf(median) else median,
        "min": hits[0] if hits else None,
        "max": hits[-1] if hits else None,
        "reached": len(hits),
        "runs": len(values),
        "per_seed": {str(seed): v for seed, v in values.items()},
    }


def ratio(other: dict[str, Any], reference: dict[str, Any]) -> dict[str, Any]:
    """other / reference: the median of the paired per-seed ratios with its bootstrap 90%
    interval and verdict (:func:`megatron_pc.analysis.budget.paired_ratio`), and the range of the
    ratios of the seeds both ran and reached."""
    return paired_ratio(other["per_seed"], reference["per_seed"])


def choose_targets(runs: list[Run], fractions: tuple[float, ...] = TARGET_FRACTIONS) -> dict[str, Any]:
    """Start accuracy, the strategies' median final gains, and the fixed targets of one task."""
    start = statistics.fmean(r.points[0].accuracy for r in runs)
    gains: dict[str, float] = {}
    for name in _labels(runs):
        gains[name] = statistics.median(r.final_accuracy - start for r in runs if r.strategy == name)
    deciding = {n: g for n, g in gains.items() if n in MAIN_STRATEGIES} or gains
    improved = [g for g in deciding.values() if g > _NO_GAIN]
    base = min(improved) if improved else None
    targets = [start + f * base for f in fractions] if base is not None else []
    no_gain = sorted(n for n, g in deciding.items() if g <= _NO_GAIN)
    return {"start_accuracy": start, "final_gain": gains, "gain_used": base, "strategies_without_gain": no_gain,
            "fractions": list(fractions) if base is not None else [], "target_accuracies": targets}  # fmt: skip


def compare(runs: list[Run], targets: list[float]) -> dict[str, Any]:
    """Per target: each strategy's rollouts and seconds to reach it (over its seeds), and ratios to Pilot-Commit."""
    out = []
    for target in targets:
        entry: dict[str, Any] = {"accuracy": target, "strategies": {}}
        for name in _labels(runs):
            mine = sorted((r for r in runs if r.strategy == name), key=lambda r: r.seed)
            entry["strategies"][name] = {axis: spread({r.seed: first_reach(r.points, target, axis) for r in mine}) for axis in ("rollouts", "seconds")}
        for reference in (REFERENCE, *VARIANT_REFERENCES):
            ref = entry["strategies"].get(reference)
            if ref is None:
                continue
            for name, figures in entry["strategies"].items():
                if name != reference:
                    figures[f"vs_{reference}"] = {axis: ratio(figures[axis], ref[axis]) for axis in ("rollouts", "seconds")}
        out.append(entry)
    return {"seeds": sorted({r.seed for r in runs}), "targets": out}


def run_figures(run: Run) -> dict[str, Any]:
    """The allocation figures of one run."""
    steps = run.steps
    last = steps[-1] if steps else {}

    def mean(key: str) -> float | None:
        values = [r[key] for r in steps if r.get(key) is not None]
        return statistics.fmean(values) if values else None

    generated = last.get("cum_generated") or 0
    piloted = last.get("cum_prompts_piloted") or 0
    drawn = last.get("cum_prompts_drawn") or 0
    train_seconds = list(step_train_seconds(run.rows).values())
    return {
        "steps": last.get("step", 0),
        "start_accuracy": run.points[0].accuracy,
        "final_accuracy": run.final_accuracy,
        "zero_variance_share_first_step": steps[0].get("zero_variance_share") if steps else None,
        "zero_variance_share": mean("zero_variance_share"),
        "group_reward_var_mean": mean("group_reward_var_mean"),
        "rollouts_per_step": mean("generated"),
        "updates_per_step": mean("updates"),
        "rollouts": generated,
        "trained_share": (last.get("cum_trained_rollouts") or 0) / generated if generated else None,
        "pilot_share": (last.get("cum_generated_pilot") or 0) / generated if generated and "cum_generated_pilot" in last else None,
        "bucket_coverage": mean("bucket_coverage"),
        "pilot_keep_rate": (last.get("cum_prompts_kept") or 0) / piloted if piloted else None,
        "prompts_evicted": last.get("cum_prompts_evicted"),
        "direct_share": (last.get("cum_prompts_direct") or 0) / drawn if drawn and "cum_prompts_direct" in last else None,
        "prompts_screened": last.get("cum_prompts_screened"),
        "screen_auc": mean("screen_auc"),
        "screen_brier": mean("screen_brier"),
        "screen_brier_population": mean("screen_brier_population"),
        "buffer_age_evictions": last.get("cum_buffer_age_evictions"),
        "partial_steps": last.get("cum_partial_steps"),
        "step_seconds": statistics.median(train_seconds) if train_seconds else None,
        "validation_seconds": validation_seconds(run.rows),
        "val_stderr": run.points[-1].stderr,
    }


def regime_figures(runs: list[Run]) -> dict[str, Any]:
    """Each strategy's run figures averaged over its seeds."""
    out: dict[str, Any] = {}
    for name in _labels(runs):
        figures = [run_figures(r) for r in runs if r.strategy == name]
        out[name] = {key: _mean_or_none([f[key] for f in figures]) for key in figures[0]}
        out[name]["seeds"] = len(figures)
        # A label's seeds share one rule and variant; differing ones are listed rather than hidden.
        for key in ("update_rule", "variant"):
            out[name][key] = ",".join(sorted({getattr(r, key) for r in runs if r.strategy == name}))
    return out


def _mean_or_none(values: list[Any]) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float))]
    return statistics.fmean(numbers) if numbers else None


def _labels(runs: list[Run]) -> list[str]:
    """Strategy labels in a stable order: the main strategies first, then the rest by name."""
    names = {r.strategy for r in runs}
    return [n for n in MAIN_STRATEGIES if n in names] + sorted(names - set(MAIN_STRATEGIES))


def summarize(runs: list[Run], fractions: tuple[float, ...] = TARGET_FRACTIONS, budget: float | None = None) -> dict[str, Any]:
    """Every figure of the report, per task (regime). With ``budget`` (every run generated that
    many rollouts), targets follow the equal-budget rule and accuracy at fixed spends is added
    (:mod:`megatron_pc.analysis.budget`); without, the older rule (fractions of the smallest final gain)."""
    regimes: dict[str, Any] = {}
    for regime in sorted({r.regime for r in runs}, key=[r.regime for r in runs].index):
        mine = [r for r in runs if r.regime == regime]
        chosen = budget_targets(mine, budget, fractions) if budget is not None else choose_targets(mine, fractions)
        regimes[regime] = {**chosen, **compare(mine, chosen["target_accuracies"]), "strategies": regime_figures(mine),
                           "runs": [{"strategy": r.strategy, "seed": r.seed, "update_rule": r.update_rule, "variant": r.variant,
                                     "run_dir": relative_path(r.run_dir)} for r in mine]}  # fmt: skip
        if budget is not None:
            regimes[regime]["at_budget"] = accuracy_at_budgets(mine, budget)
            regimes[regime]["validation_precision"] = validation_precision(mine, chosen)
    return {"regimes": regimes, "budget": budget, "statistic": STATISTIC,
            "target_rule": "start + fractions x median over strategies of their gains at the budget" if budget is not None
            else "start + fractions x the smallest final gain of the main strategies (older design, steps matched)"}  # fmt: skip


# ---- writing ---------------------------------------------------------------------------------


def write_report(runs: list[Run], out: Path, *, fractions: tuple[float, ...] = TARGET_FRACTIONS, budget: float | None = None,
                 extra: dict[str, Any] | None = None, sections: list[str] | None = None) -> dict[str, Any]:  # fmt: skip
    """report.md, summary.json and the plots in ``out``; returns the summary.

    ``extra`` is merged into summary.json (the benchmark adds its regimes, simulator and
    ablations); ``sections`` are markdown blocks appended to report.md.
    """
    check_unique(runs)
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(runs, fractions, budget)
    summary["plots"] = draw_all(runs, summary, out)
    if extra:
        summary.update(extra)
    (out / "report.md").write_text(markdown(summary, sections or []))
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    tmp.replace(out / "summary.json")
    return summary


def main(argv: list[str] | None = None) -> int:
    """``megatron-pc report RUN_DIR... [--out DIR]``."""
    parser = argparse.ArgumentParser(prog="megatron-pc report", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="training run directories (with metrics.jsonl)")
    parser.add_argument("--out", default="report", help="where report.md, summary.json and the PNGs go (default: ./report)")
    parser.add_argument("--label-by", choices=("strategy", "dir"), default="strategy",
                        help="name a run's line by allocation.strategy, or by the directory above the run")  # fmt: skip
    parser.add_argument("--target-fractions", default=",".join(map(str, TARGET_FRACTIONS)),
                        help="targets as shares of the smallest final gain (default 0.25,0.5,0.75)")  # fmt: skip
    parser.add_argument("--budget", type=float, default=None,
                        help="the rollout budget every run spent: targets from the strategies' median gain at it, accuracy at 1/4..1 of it")  # fmt: skip
    args = parser.parse_args(argv)
    runs = [load_run(d, label_by=args.label_by) for d in args.run_dirs]
    summary = write_report(runs, Path(args.out), fractions=parse_fractions(args.target_fractions), budget=args.budget)
    print(f"report: {Path(args.out) / 'report.md'} ({len(runs)} runs, {len(summary['regimes'])} tasks); "
          f"plots: {', '.join(summary['plots'])}")  # fmt: skip
    return 0


def parse_fractions(text: str) -> tuple[float, ...]:
    """Comma-separated shares in (0, 1]."""
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise MegatronPCError(f"--target-fractions: {text!r} is not a comma-separated list of numbers") from None
    if not values or not all(0.0 < v <= 1.0 for v in values):
        raise MegatronPCError(f"--target-fractions: each must lie in (0, 1], got {text!r}")
    return values
