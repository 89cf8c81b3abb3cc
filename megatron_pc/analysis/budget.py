"""Comparisons at an equal rollout budget, and the one statistic every ratio is given with.

The benchmark's design (docs/benchmarks.md, "Equal budgets"):

* Every strategy runs until it has generated the same ``R`` rollouts (``training.rollout_budget``);
  steps vary by strategy.
* Accuracy at a spend is interpolated linearly between the validations around it (validation is
  on a rollout schedule, ``training.validate_every_rollouts``, so every strategy is measured at
  about the same spends). A run that stopped short of a spend has no accuracy there.
* Targets: the start accuracy plus fractions of the **median over strategies** (variants and
  ablations left out) of their median (over seeds) gain at ``R``. The median does not move when the worst (or best) strategy does:
  no single strategy decides where the targets lie, and at least half the strategies have gained
  that much by ``R``.
* One statistic: the median over seeds of the paired per-seed ratio (other / reference, the same
  seed), with a percentile bootstrap 90% interval over seeds. A seed where only the reference
  reached a target counts as an infinite ratio, one where only the other did as 0, one where
  neither did is left out. An interval that contains 1 is a tie, and is written as one.
"""

from __future__ import annotations

import json
import math
import random
import statistics
from pathlib import Path
from typing import Any, Iterable

from megatron_pc.analysis.runs import Point, Run
from megatron_pc.errors import MegatronPCError

BUDGET_SHARES = (0.25, 0.5, 0.75, 1.0)
"""Spends (shares of the budget) at which accuracy is reported."""
BOOTSTRAP_RESAMPLES = 4000
INTERVAL = 0.90
STATISTIC = ("median of paired per-seed ratios (other / reference, same seed), percentile bootstrap 90% interval over seeds "
             f"({BOOTSTRAP_RESAMPLES} resamples); an interval containing 1 is a tie")  # fmt: skip


def per_seed_ratios(other: dict[str, float | None], reference: dict[str, float | None]) -> dict[str, float]:
    """Other over reference, seed by seed, for the seeds both ran: inf where only the reference
    reached, 0 where only the other did; seeds where neither reached are left out."""
    out: dict[str, float] = {}
    for seed in sorted(set(other) & set(reference)):
        a, b = other[seed], reference[seed]
        if a is None and b is None:
            continue
        out[seed] = math.inf if a is None else 0.0 if b is None else (a / b if b > 0 else math.inf)
    return out


def bootstrap_interval(values: list[float], level: float = INTERVAL, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of ``values`` (a fixed seed: a report is reproducible)."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(resamples))
    tail = (1.0 - level) / 2.0
    return medians[int(math.floor(tail * (resamples - 1)))], medians[int(math.ceil((1.0 - tail) * (resamples - 1)))]


def paired_ratio(other: dict[str, float | None], reference: dict[str, float | None]) -> dict[str, Any]:
    """The statistic: median of the per-seed ratios, its interval, and what it says.

    ``status``: ``both`` (a finite median), ``reference_only`` (the median is infinite: in most
    seeds only the reference reached), ``other_only`` (median 0), ``neither`` (no pair).
    ``verdict``: ``other_more`` (the interval lies above 1: the other needed more than the
    reference), ``other_less`` (below 1), ``tie`` (it contains 1) or None (no pair).
    Infinite bounds are written as None with ``ci_high_unbounded``."""
    ratios = per_seed_ratios(other, reference)
    values = list(ratios.values())
    if not values:
        return {"ratio": None, "status": "neither", "ci_low": None, "ci_high": None, "ci_high_unbounded": False, "verdict": None,
                "pairs": 0, "per_seed": {}, "seed_min": None, "seed_max": None}  # fmt: skip
    median = statistics.median(values)
    low, high = bootstrap_interval(values)
    status = "reference_only" if math.isinf(median) else "other_only" if median == 0 else "both"
    verdict = "other_more" if low > 1.0 else "other_less" if high < 1.0 else "tie"
    finite = [v for v in values if math.isfinite(v) and v > 0]
    return {
        "ratio": median if status == "both" else None,
        "status": status,
        "ci_low": low if math.isfinite(low) else None,
        "ci_high": high if math.isfinite(high) else None,
        "ci_high_unbounded": math.isinf(high),
        "verdict": verdict,
        "pairs": len(values),
        "per_seed": {s: (v if math.isfinite(v) else None) for s, v in ratios.items()},
        "seed_min": min(finite, default=None),
        "seed_max": max(finite, default=None),
    }


def interval_text(r: dict[str, Any]) -> str:
    """``[0.91-1.62]``, with an unbounded end as inf."""
    if r.get("ci_low") is None and not r.get("ci_high_unbounded"):
        return ""
    low = "inf" if r["ci_low"] is None else f"{r['ci_low']:.2f}"
    high = "inf" if r["ci_high_unbounded"] else f"{r['ci_high']:.2f}"
    return f"[{low}-{high}]"


def verdict_words(r: dict[str, Any], other: str, reference: str = "PC") -> str:
    """The ratio in words: who needed fewer rollouts, or a tie."""
    v = r.get("verdict")
    if v is None:
        return "neither reached"
    if v == "tie":
        return f"tie (90% interval {interval_text(r)} contains 1)"
    fewer = reference if v == "other_more" else other
    return f"{fewer} needs fewer (90% interval {interval_text(r)} excludes 1)"


def accuracy_at(points: list[Point], rollouts: float) -> float | None:
    """Validation accuracy at a spend, linear between the validations around it (None past the
    run's last validation)."""
    previous: Point | None = None
    for p in points:
        if p.rollouts >= rollouts:
            if previous is None or p.rollouts == previous.rollouts:
                return p.accuracy
            share = (rollouts - previous.rollouts) / (p.rollouts - previous.rollouts)
            return previous.accuracy + share * (p.accuracy - previous.accuracy)
        previous = p
    return None


def labels_of(runs: Iterable[Run]) -> list[str]:
    """Strategy labels in first-seen order."""
    out: list[str] = []
    for r in runs:
        if r.strategy not in out:
            out.append(r.strategy)
    return out


def accuracy_at_budgets(runs: list[Run], budget: float, shares: tuple[float, ...] = BUDGET_SHARES) -> dict[str, Any]:
    """Per strategy and spend (share x budget): the median accuracy over seeds and the seeds' band."""
    out: dict[str, Any] = {}
    for name in labels_of(runs):
        mine = sorted((r for r in runs if r.strategy == name), key=lambda r: r.seed)
        rows = []
        for share in shares:
            values = {str(r.seed): accuracy_at(r.points, share * budget) for r in mine}
            hits = [v for v in values.values() if v is not None]
            rows.append({"share": share, "rollouts": share * budget, "median": statistics.median(hits) if len(hits) == len(values) else None,
                         "min": min(hits, default=None), "max": max(hits, default=None), "per_seed": values})  # fmt: skip
        out[name] = rows
    return out


def budget_targets(runs: list[Run], budget: float, fractions: tuple[float, ...]) -> dict[str, Any]:
    """Start accuracy, each strategy's median gain at the budget, and the targets: start plus
    fractions of the median of those gains (module docstring)."""
    start = statistics.fmean(r.points[0].accuracy for r in runs)
    # The strategies decide; variants and ablations (controls run beside them) are measured against them.
    deciding = [r for r in runs if r.variant == "none"] or runs
    gains: dict[str, float] = {}
    for name in labels_of(deciding):
        at_budget = [accuracy_at(r.points, budget) for r in runs if r.strategy == name]
        if at_budget and all(a is not None for a in at_budget):
            gains[name] = statistics.median(a - start for a in at_budget if a is not None)
    gain = statistics.median(gains.values()) if gains else None
    usable = gain is not None and gain > 1e-9
    short = sorted(set(labels_of(deciding)) - set(gains))
    return {"start_accuracy": start, "final_gain": gains, "gain_used": gain if usable else None, "gain_rule": "median over strategies at the budget",
            "strategies_short_of_budget": short, "strategies_without_gain": sorted(n for n, g in gains.items() if g <= 1e-9),
            "fractions": list(fractions) if usable else [], "target_accuracies": [start + f * gain for f in fractions] if usable and gain else []}  # fmt: skip


def validation_precision(runs: list[Run], targets: dict[str, Any]) -> dict[str, Any]:
    """The largest standard error of one validation beside the smallest gap between targets
    (the start counts as a target of fraction 0): the rule is stderr < gap / 3."""
    errors = [p.stderr for r in runs for p in r.points if p.stderr is not None]
    stderr = max(errors) if errors else None
    levels = [targets["start_accuracy"], *targets["target_accuracies"]]
    gap = min((b - a for a, b in zip(levels, levels[1:])), default=None)
    ok = None if stderr is None or gap is None else stderr < gap / 3.0
    prompts = next((r.val_prompts for r in runs if r.val_prompts), None)
    needed = prompts_needed(stderr, prompts, gap) if stderr and prompts and gap else None
    return {"stderr": stderr, "smallest_gap": gap, "ok": ok, "rule": "stderr < smallest gap / 3", "val_prompts": prompts,
            "prompts_needed": needed}  # fmt: skip


def prompts_needed(stderr: float, prompts: int, gap: float) -> int:
    """Validation prompts that bring a standard error of ``stderr`` over ``prompts`` prompts
    under gap / 3 (a standard error over prompts falls as 1 / sqrt(prompts))."""
    return math.ceil(prompts * (3.0 * stderr / gap) ** 2)


def read_summary(path: Path) -> dict[str, Any]:
    """An equal-budget report's summary.json (``megatron-pc report --budget R``, ``bench rollouts
    --budget R``); refuses an unreadable file or a step-matched one, naming the file."""
    try:
        summary = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise MegatronPCError(f"{path}: not a readable summary.json ({err})") from err
    if not isinstance(summary, dict) or summary.get("budget") is None or not isinstance(summary.get("regimes"), dict):
        raise MegatronPCError(f"{path}: no 'budget' or 'regimes': not the summary of an equal-budget report (--budget R)")
    return summary
