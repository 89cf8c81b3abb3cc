#!/usr/bin/env python3
"""The cross-regime verdict of an equal-budget benchmark, read from its summary.json files.

    .venv/bin/python scripts/verdict_table.py SUMMARY.json [SUMMARY.json...] [--reference grpo] [--paired]

Each SUMMARY.json is one written by `megatron-pc report --budget R` or `bench rollouts --budget R`
(results/bench_budget_report/summary.json is the kept one); regimes are taken in the order given,
and a regime found twice is refused. Prints one markdown table: per label, the accuracy at the
budget R (median [seed range]) in each regime, then REFERENCE / label in rollouts to each target
(the summary's median of paired per-seed ratios; `*` where its 90% bootstrap interval excludes 1,
otherwise a tie; `-` where the summary holds no such ratio). docs/benchmarks.md's table "GRPO
against every Pilot-Commit label" is this output (tests/unit/test_verdict_table.py checks it).
With --paired, a second table: each label's accuracy at R minus the reference's, seed by seed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from megatron_pc.analysis.budget import read_summary
from megatron_pc.analysis.report_format import accuracy_cell
from megatron_pc.errors import MegatronPCError


def load_regimes(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """The regimes of the summaries, in order; refuses a file without regimes and a regime given twice."""
    regimes: dict[str, dict[str, Any]] = {}
    for path in paths:
        for name, regime in read_summary(path)["regimes"].items():
            if name in regimes:
                raise MegatronPCError(f"{path}: regime {name} is in an earlier summary too; give each regime once")
            regimes[name] = regime
    return regimes


def at_budget(regime: dict[str, Any], label: str) -> dict[str, Any] | None:
    """The label's accuracy at the full budget (share 1.0) in a regime, or None."""
    return next((row for row in regime.get("at_budget", {}).get(label, []) if row.get("share") == 1.0), None)


def _accuracy(regime: dict[str, Any], label: str) -> str:
    row = at_budget(regime, label)
    return "-" if row is None else accuracy_cell(row)


def _ratio(target: dict[str, Any], reference: str, label: str) -> str:
    found = target.get("strategies", {}).get(reference, {}).get(f"vs_{label}", {}).get("rollouts")
    if not found or found.get("ratio") is None:
        return "-"
    return f"{found['ratio']:.2f}x" + ("" if found.get("verdict") == "tie" else "*")


def _ratios(regime: dict[str, Any], reference: str, label: str) -> str:
    cells = [_ratio(t, reference, label) for t in regime.get("targets", [])]
    return "-" if all(c == "-" for c in cells) else " / ".join(cells)


def labels_of(regimes: dict[str, dict[str, Any]]) -> list[str]:
    return sorted({label for regime in regimes.values() for label in regime.get("at_budget", {})})


def table(regimes: dict[str, dict[str, Any]], reference: str = "grpo") -> str:
    names = list(regimes)
    head = ["label", *(f"`{n}` acc at R" for n in names), *(f"`{n}` {reference.upper()}/label" for n in names)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in labels_of(regimes):
        cells = [label, *(_accuracy(regimes[n], label) for n in names),
                 *("-" if label == reference else _ratios(regimes[n], reference, label) for n in names)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def paired_table(regimes: dict[str, dict[str, Any]], reference: str = "grpo") -> str:
    """Accuracy at R minus the reference's, same seed, for each label and regime (seeds in order)."""
    names = list(regimes)
    lines = ["| label | " + " | ".join(f"`{n}` minus {reference}, by seed" for n in names) + " |", "|---|" + "---|" * len(names)]
    for label in labels_of(regimes):
        if label == reference:
            continue
        cells = []
        for name in names:
            mine, ref = at_budget(regimes[name], label), at_budget(regimes[name], reference)
            if mine is None or ref is None:
                cells.append("-")
                continue
            seeds = sorted(set(mine["per_seed"]) & set(ref["per_seed"]), key=int)
            cells.append(", ".join(f"{mine['per_seed'][s] - ref['per_seed'][s]:+.3f}" for s in seeds) or "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", nargs="+", type=Path, help="summary.json of an equal-budget report")
    parser.add_argument("--reference", default="grpo", help="the label every other is compared with (default grpo)")
    parser.add_argument("--paired", action="store_true", help="also the per-seed difference in accuracy at R")
    args = parser.parse_args(argv)
    try:
        regimes = load_regimes(args.summaries)
        if not any(args.reference in r.get("at_budget", {}) for r in regimes.values()):
            raise MegatronPCError(f"--reference {args.reference}: no such label in {', '.join(map(str, args.summaries))}")
    except MegatronPCError as err:
        print(f"verdict_table: {err}", file=sys.stderr)
        return 1
    print(table(regimes, args.reference))
    if args.paired:
        print()
        print(paired_table(regimes, args.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
