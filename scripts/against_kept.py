#!/usr/bin/env python3
"""New runs of an equal-budget benchmark measured against a kept report's runs, by its summary.

    .venv/bin/python scripts/against_kept.py SUMMARY.json RUN_DIR... [--against grpo,pc_meta,pc_screen]

For runs added after a matrix's own runs are gone (only its report was kept: its summary.json
holds, per regime, label and seed, the accuracy at R/4, R/2, 3R/4 and R and the rollouts to each
target), e.g. issue #40's ablations beside results/bench_budget_report. RUN_DIRs are in the
benchmark's layout (REGIME/LABEL[@RULE]/seed_K, labelled by the directory as `megatron-pc report
--label-by dir` does). The comparison is only fair when the new runs started where the kept ones
did: each new label must have run the kept seeds, and the mean of their step-0 validations must be
the kept start accuracy (the start model and the validation set must be the kept ones), else the
script stops. The
targets are the kept report's (the new labels do not move them). Prints per regime:

* accuracy at each spend (median [seed range]) and, seed by seed, minus each --against label's;
* rollouts to each kept target, and KEPT_LABEL / new label as the median of paired per-seed
  ratios with its bootstrap 90% interval (megatron_pc.analysis.budget.paired_ratio; `*` where it
  excludes 1, a tie otherwise; above 1 the new label needed fewer).
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from pathlib import Path
from typing import Any

from megatron_pc.analysis.budget import accuracy_at, accuracy_at_budgets, interval_text, paired_ratio, read_summary
from megatron_pc.analysis.report_format import accuracy_cell
from megatron_pc.analysis.report import first_reach
from megatron_pc.analysis.runs import Run, load_run
from megatron_pc.errors import MegatronPCError

START_TOLERANCE = 1e-9
"""Step-0 accuracies are exact fractions of one validation set: equal starts are equal floats."""


def check_start(regime: str, kept: dict[str, Any], runs: list[Run]) -> None:
    """Every new label's runs start where the kept runs did, or the comparison is refused.

    A run's step-0 validation depends on the start model, the validation set and the seed (its
    sampling), never on the strategy; the kept summary holds its mean over the kept seeds. So each
    label must have run exactly the kept seeds, and the mean of its step-0 accuracies must be the
    kept one (equal floats up to rounding: the same model and set give the same samples)."""
    want, seeds = kept["start_accuracy"], sorted(str(s) for s in kept.get("seeds", []))
    for label in sorted({r.strategy for r in runs}):
        mine = sorted((r for r in runs if r.strategy == label), key=lambda r: r.seed)
        have = [str(r.seed) for r in mine]
        if have != seeds:
            raise MegatronPCError(f"{regime}: {label} has seeds {', '.join(have)}, the kept runs {', '.join(seeds)}: the start can only be "
                                  "checked over the same seeds (the kept summary holds their mean step-0 accuracy)")  # fmt: skip
        starts = [r.points[0].accuracy if r.points[0].step == 0 else math.nan for r in mine]
        mean = statistics.fmean(starts)
        if not abs(mean - want) <= START_TOLERANCE:
            found = ", ".join(f"{r.run_dir} {a:.6f}" for r, a in zip(mine, starts))
            raise MegatronPCError(f"{regime}: {label}'s runs did not start where the kept runs did (mean step-0 accuracy {mean:.6f}, kept "
                                  f"{want:.6f}; {found}): they need the kept start model, validation set and seeds")  # fmt: skip


def regime_tables(regime: str, kept: dict[str, Any], runs: list[Run], budget: float, against: list[str]) -> str:
    labels = sorted({r.strategy for r in runs})
    against = [a for a in against if a in kept.get("at_budget", {})]
    shares = [row["share"] for row in next(iter(kept["at_budget"].values()))]
    lines = [f"### `{regime}`: {', '.join(labels)} against the kept {', '.join(against)}", "",
             "| label | " + " | ".join(f"acc at {s:g}R" for s in shares) + " | " + " | ".join(f"at R minus {a}, by seed" for a in against) + " |",
             "|---|" + "---|" * (len(shares) + len(against))]  # fmt: skip
    spends = accuracy_at_budgets(runs, budget, tuple(shares))
    for label in labels:
        mine = {str(r.seed): r for r in runs if r.strategy == label}
        cells = [accuracy_cell(row) for row in spends[label]]
        for name in against:
            ref = next(row for row in kept["at_budget"][name] if row["share"] == 1.0)["per_seed"]
            diffs = [f"{accuracy_at(mine[s].points, budget) - ref[s]:+.3f}" for s in sorted(mine, key=int)
                     if s in ref and ref[s] is not None and accuracy_at(mine[s].points, budget) is not None]  # fmt: skip
            cells.append(", ".join(diffs) or "-")
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    lines += ["", "| label | target | rollouts (median [range], reached) | " + " | ".join(f"{a} / label" for a in against) + " |",
              "|---|---|---|" + "---|" * len(against)]  # fmt: skip
    for label in labels:
        mine = {str(r.seed): r for r in runs if r.strategy == label}
        for fraction, target in zip(kept["fractions"], kept["targets"]):
            reach = {s: first_reach(r.points, target["accuracy"], "rollouts") for s, r in mine.items()}
            hits = [v for v in reach.values() if v is not None]
            cells = [f"{statistics.median(hits):,.0f} [{min(hits):,.0f}-{max(hits):,.0f}], {len(hits)}/{len(reach)}" if hits else f"-, 0/{len(reach)}"]
            for name in against:
                ref = target["strategies"].get(name, {}).get("rollouts", {}).get("per_seed", {})
                r = paired_ratio({s: ref.get(s) for s in reach}, reach)
                cells.append("-" if r["ratio"] is None else f"{r['ratio']:.2f}x{'' if r['verdict'] == 'tie' else '*'} {interval_text(r)}")
            lines.append(f"| {label} | {fraction:.0%} ({target['accuracy']:.4f}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("summary", type=Path, help="the kept report's summary.json (equal budget)")
    parser.add_argument("run_dirs", nargs="+", type=Path, help="new runs: REGIME/LABEL[@RULE]/seed_K")
    parser.add_argument("--against", default="grpo,pilot_commit,pc_screen,pc_meta", help="kept labels to compare with (comma-separated)")
    args = parser.parse_args(argv)
    try:
        summary = read_summary(args.summary)
        runs = [load_run(d, label_by="dir") for d in args.run_dirs]
        against = [a for a in args.against.split(",") if a]
        out = []
        for regime in sorted({r.regime for r in runs}):
            kept = summary["regimes"].get(regime)
            if kept is None:
                raise MegatronPCError(f"regime {regime} (of {', '.join(str(r.run_dir) for r in runs if r.regime == regime)}) is not in {args.summary}")
            mine = [r for r in runs if r.regime == regime]
            check_start(regime, kept, mine)
            missing = [a for a in against if a not in kept.get("at_budget", {})]
            if missing:
                raise MegatronPCError(f"--against: {', '.join(missing)} not among {regime}'s kept labels ({', '.join(sorted(kept['at_budget']))})")
            out.append(regime_tables(regime, kept, mine, float(summary["budget"]), against))
    except MegatronPCError as err:
        print(f"against_kept: {err}", file=sys.stderr)
        return 1
    print("\n\n".join(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
