#!/usr/bin/env python3
"""Validation accuracy each strategy had reached within fixed rollout budgets, medians over seeds.

    scripts/accuracy_at_budgets.py BENCH_DIR/REGIME 20000,40000,60000

BENCH_DIR/REGIME is a regime folder of `megatron-pc bench rollouts` (STRATEGY/seed_K/metrics.jsonl);
the accuracy at a budget is linear between the validations around it. Prints a markdown table.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

STRATEGIES = ("pilot_commit", "grpo", "dapo", "pc_history")


def accuracy_at(points: list[tuple[float, float]], budget: float) -> float | None:
    """Accuracy at ``budget`` rollouts from (cumulative rollouts, accuracy) points; None past the last."""
    for (x0, a0), (x1, a1) in zip(points, points[1:]):
        if x0 <= budget <= x1:
            return a1 if x1 == x0 else a0 + (a1 - a0) * (budget - x0) / (x1 - x0)
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
        files = sorted(regime_dir.glob(f"{strategy}/seed_*/metrics.jsonl"))
        if not files:
            continue
        at: dict[int, list[float | None]] = {b: [] for b in budgets}
        finals, totals = [], []
        for path in files:
            rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            points = [(float(r.get("cum_generated", 0)), float(r["val_accuracy"])) for r in rows if "val_accuracy" in r]
            if not points:
                raise SystemExit(f"accuracy_at_budgets: {path} has no validation rows (val_accuracy)")
            finals.append(statistics.fmean(a for _, a in points[-3:]))
            totals.append(points[-1][0])
            for b in budgets:
                at[b].append(accuracy_at(points, b))
        lines.append(f"| {strategy} | {len(files)} | " + " | ".join(_spread(at[b]) for b in budgets)
                     + f" | {_spread(finals)} | {statistics.median(totals):,.0f} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        raise SystemExit("usage: scripts/accuracy_at_budgets.py BENCH_DIR/REGIME 20000,40000,60000")
    regime_dir = Path(argv[0])
    if not regime_dir.is_dir():
        raise SystemExit(f"accuracy_at_budgets: {regime_dir} is not a directory")
    try:
        budgets = [int(b) for b in argv[1].split(",") if b.strip()]
    except ValueError:
        raise SystemExit(f"accuracy_at_budgets: budgets must be whole numbers separated by commas, got {argv[1]!r}") from None
    print(table(regime_dir, budgets))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
