#!/usr/bin/env python3
"""The ablations of the metadata prior (docs/metadata_prior.md), read from equal-budget summaries.

    .venv/bin/python scripts/ablation_table.py SUMMARY.json [SUMMARY.json...] [--labels a,b,...]

Each SUMMARY.json is one written by `megatron-pc report --budget R` or `bench rollouts --budget R`.
For every regime in them, one markdown table with a row per label present (by default
pc_screen, pc_screen_sized, pc_meta, pc_meta_coarse, pc_meta_noisy, pc_meta_sized, and the short pilot
of 2's pc_screen_sized_sp2, pc_meta_sized_sp2):

- GRPO / label and pc_screen / label in rollouts to the 25 / 50 / 75% targets: the median of paired
  per-seed ratios and its 90% bootstrap interval; above 1 the label needed fewer; `tie` where the
  interval holds 1;
- accuracy at the budget R (median [seed range]);
- the means over seeds of the pilot share, trained share, pilot keep rate, bucket coverage, and the
  keep prediction's Brier (the population prior's beside it) and AUC.

pc_screen is the method without the labels, so its column reads "with metadata against without".
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from megatron_pc.analysis.budget import interval_text
from megatron_pc.analysis.report_format import accuracy_cell
from megatron_pc.errors import MegatronPCError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from verdict_table import at_budget, load_regimes  # noqa: E402

LABELS = ("pc_screen", "pc_screen_sized", "pc_meta", "pc_meta_coarse", "pc_meta_noisy", "pc_meta_sized",
          "pc_screen_sized_sp2", "pc_meta_sized_sp2")


def ratio_cell(target: dict[str, Any], other: str, label: str) -> str:
    """``1.42x [1.10-1.80]``, with ``tie`` where the interval holds 1; ``-`` where the summary has none."""
    if other == label:
        return "-"
    found = target.get("strategies", {}).get(other, {}).get(f"vs_{label}", {}).get("rollouts")
    if not found or found.get("ratio") is None:
        return "-"
    tie = " tie" if found.get("verdict") == "tie" else ""
    return f"{found['ratio']:.2f}x {interval_text(found)}{tie}".replace("  ", " ")


def _mean(value: float | None, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def table(name: str, regime: dict[str, Any], labels: tuple[str, ...] = LABELS) -> str:
    present = [label for label in labels if label in regime.get("strategies", {})]
    if not present:
        raise MegatronPCError(f"regime {name}: none of {', '.join(labels)} is among its labels")
    targets = regime.get("targets", [])
    fractions = [f"{round(100 * f)}%" for f in regime.get("fractions", [])] or [str(i + 1) for i in range(len(targets))]
    head = ["label", *(f"GRPO/label {f}" for f in fractions), *(f"pc_screen/label {f}" for f in fractions), "acc at R",
            "pilot share", "trained share", "pilot keep rate", "bucket coverage", "keep Brier (population's)", "keep AUC"]  # fmt: skip
    lines = [f"`{name}`:", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label in present:
        s = regime["strategies"][label]
        row = at_budget(regime, label)
        brier = "-" if s.get("screen_brier") is None else f"{s['screen_brier']:.3f} ({_mean(s.get('screen_brier_population'), '.3f')})"
        cells = [label, *(ratio_cell(t, "grpo", label) for t in targets), *(ratio_cell(t, "pc_screen", label) for t in targets),
                 "-" if row is None else accuracy_cell(row),
                 _mean(s.get("pilot_share"), ".2f"), _mean(s.get("trained_share"), ".2f"), _mean(s.get("pilot_keep_rate"), ".2f"),
                 _mean(s.get("bucket_coverage"), ".2f"), brier, _mean(s.get("screen_auc"), ".3f")]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summaries", nargs="+", type=Path, help="summary.json of an equal-budget report")
    parser.add_argument("--labels", default=",".join(LABELS), help="comma-separated labels, in row order")
    args = parser.parse_args(argv)
    labels = tuple(label for label in args.labels.split(",") if label)
    try:
        print("\n\n".join(table(name, regime, labels) for name, regime in load_regimes(args.summaries).items()))
    except MegatronPCError as err:
        raise SystemExit(f"ablation_table: {err}") from None  # exit status 1, the message on stderr
    return 0


if __name__ == "__main__":
    sys.exit(main())
