#!/usr/bin/env python3
"""Validation accuracy each strategy had reached within fixed rollout budgets, medians over seeds.

    .venv/bin/python scripts/accuracy_at_budgets.py BENCH_DIR/REGIME 20000,40000,60000

BENCH_DIR/REGIME is a regime folder of `megatron-pc bench rollouts` (STRATEGY/seed_K/metrics.jsonl);
the accuracy at a budget is linear between the validations around it. Prints a markdown table.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from megatron_pc.analysis.runs import Point, load_run, run_dirs
from megatron_pc.errors import MegatronPCError

STRATEGIES = ("pilot_commit", "grpo", "dapo", "pc_history")


def accuracy_at(points: list[Point], budget: float) -> float | None:
    """Accuracy at ``budget`` cumulative rollouts, linear between validations; None past the last."""
    for p0, p1 in zip(points, points[1:]):
        if p0.rollouts <= budget <= p1.rollouts:
            if p1.rollouts == p0.rollouts:
                return p1.accuracy
            return p0.accuracy + (p1.accuracy - p0.accuracy) * (budget - p0.rollouts) / (p1.rollouts - p0.rollouts)
    return None


def _spread(values: list[float | None]) -> str:
    hits = [v for v in values if v is not None]
    if not hits:
        return f"- (0/{len(values)} got that far)"
    text = f"{statistics.median(hits):.3f} [{min(hits):.3f}-{max(hits):.3f}]"
    return text if len(hits) == len(values) else f"{text} ({len(hits)}/{len(values)})"


def table(regime_dir: Path, budgets: list[int]) -> str:
    lines = ["| strategy | seeds | " + " | ".join(f"at {b:,} rollouts" for b in budgets) + " | final (last 3 validations) | rollouts in the run |",
             "|---|---|" + "---|" * (len(budgets) + 2)]  # fmt: skip
    for strategy in STRATEGIES:
        runs = [load_run(path) for path in run_dirs(regime_dir, f"{strategy}/seed_*")]
        if not runs:
            continue
        at = {b: [accuracy_at(run.points, b) for run in runs] for b in budgets}
        finals = [run.final_accuracy for run in runs]
        totals = [run.points[-1].rollouts for run in runs]
        lines.append(f"| {strategy} | {len(runs)} | " + " | ".join(_spread(at[b]) for b in budgets)
                     + f" | {_spread(finals)} | {statistics.median(totals):,.0f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit("usage: .venv/bin/python scripts/accuracy_at_budgets.py BENCH_DIR/REGIME 20000,40000,60000")
    regime_dir = Path(argv[0])
    if not regime_dir.is_dir():
        raise SystemExit(f"accuracy_at_budgets: {regime_dir} is not a directory")
    try:
        budgets = [int(b) for b in argv[1].split(",") if b.strip()]
    except ValueError:
        raise SystemExit(f"accuracy_at_budgets: budgets must be whole numbers separated by commas, got {argv[1]!r}") from None
    try:
        print(table(regime_dir, budgets))
    except MegatronPCError as err:
        raise SystemExit(f"accuracy_at_budgets: {err}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
