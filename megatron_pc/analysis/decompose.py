"""``megatron-pc decompose BENCH_DIR [--equal-runs DIR...]``: where the paper's gain comes from.

The paper reports that Pilot-Commit reaches a target accuracy with 1.5-1.9x fewer rollouts than
GRPO and 2.3-4.0x fewer than DAPO. Our measurements differ from the paper's in three ways that
the benchmark can switch one at a time (docs/benchmarks.md, "Update rules and the controls"):
how a step splits into optimizer updates (the recipe's rule gives PC 6 updates a step and GRPO
4; our earlier benchmark gave everyone 1), GRPO's loss denominator (the recipe's token mean
counts the zero-variance groups' tokens), and DAPO's oversampling (the recipe draws 3x the train
batch a round). This module puts the ratios side by side, per regime and target:

    column        ratio (rollouts to the target)    runs
    paper         GRPO/PC, DAPO/PC                   the paper's published range
    equal/1       GRPO/PC                            a benchmark of 1 update a step (--equal-runs)
    reference     GRPO/PC                            the recipe's rule
    pc_4up        GRPO / PC with 4 equal updates     "more updates" without "in proportion"
    grpo_fair     GRPO (informative denominator)/PC  GRPO undiluted by zero-variance tokens
    dapo 1x       DAPO/PC                            DAPO drawing the train batch a round
    dapo_3x       DAPO 3x/PC                         DAPO drawing 3x, as the recipe

Each set of runs keeps its own targets (the start plus 25/50/75% of the smallest final gain of
its main strategies), so the ratios compare, not the target accuracies. A ratio is the median
over seeds of the other's rollouts over the median of the reference's; the range is over the
seeds both reached (report.ratio).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from megatron_pc.analysis.report import TARGET_FRACTIONS, choose_targets, first_reach, parse_fractions, ratio, spread
from megatron_pc.analysis.regimes import REGIMES
from megatron_pc.analysis.runs import Run, load_run, run_dirs
from megatron_pc.errors import MegatronPCError

PAPER_RATIOS = {"grpo": (1.5, 1.9), "dapo": (2.3, 4.0)}
"""The paper's published rollouts-to-target ratios over Pilot-Commit (docs/pilot_commit.md)."""

COLUMNS: tuple[tuple[str, str, str, str, str], ...] = (
    # (key, heading, other label, reference label, run set)
    ("equal1", "GRPO/PC, 1 update", "grpo", "pilot_commit", "equal"),
    ("reference", "GRPO/PC, recipe's rule", "grpo", "pilot_commit", "reference"),
    ("pc_4up", "GRPO/pc_4up", "grpo", "pc_4up", "reference"),
    ("grpo_fair", "grpo_fair/PC", "grpo_fair", "pilot_commit", "reference"),
    ("dapo_1x", "DAPO 1x/PC", "dapo", "pilot_commit", "reference"),
    ("dapo_3x", "dapo_3x/PC", "dapo_3x", "pilot_commit", "reference"),
)


def find_runs(bench_dir: str | Path) -> list[Run]:
    """Every finished run (a ``seed_K.wall.json`` beside it, written when a run ends) of a
    benchmark's layout, BENCH_DIR/REGIME/LABEL[@RULE]/seed_K, labelled by its directory (the
    rule read from its config)."""
    root = Path(bench_dir)
    if not root.is_dir():
        raise MegatronPCError(f"benchmark directory {root} does not exist")
    dirs = [d for d in run_dirs(root, "*/*/seed_*") if d.with_suffix(".wall.json").is_file()]
    if not dirs:
        raise MegatronPCError(f"{root} holds no finished runs (REGIME/LABEL/seed_K/metrics.jsonl with seed_K.wall.json)")
    return [load_run(d, regime=d.parent.parent.name, seed=int(d.name.removeprefix("seed_")), label_by="dir") for d in dirs]


def start_model(bench_dir: str | Path, regime: str) -> str | None:
    """The SHA-256 of the start model a benchmark recorded for ``regime`` (REGIME/start_model.json), if any."""
    record = Path(bench_dir) / regime / "start_model.json"
    return json.loads(record.read_text())["sha256"] if record.is_file() else None


def same_start(runs: list[Run], bench_dir: str | Path, reference_dir: str | Path) -> tuple[list[Run], list[str]]:
    """The runs of regimes whose recorded start model is the reference benchmark's, and the
    regimes left out (no record, or another model): their ratios would compare other starts."""
    left_out = sorted({r.regime for r in runs if start_model(bench_dir, r.regime) is None
                       or start_model(bench_dir, r.regime) != start_model(reference_dir, r.regime)})  # fmt: skip
    return [r for r in runs if r.regime not in left_out], left_out


def _ratios(runs: list[Run], other: str, reference: str, targets: list[float]) -> list[dict[str, Any] | None]:
    """Per target: other / reference in rollouts (report.ratio), None if either has no run."""
    mine = [r for r in runs if r.strategy == other]
    theirs = [r for r in runs if r.strategy == reference]
    if not mine or not theirs:
        return [None] * len(targets)
    return [ratio(spread({r.seed: first_reach(r.points, t, "rollouts") for r in mine}),
                  spread({r.seed: first_reach(r.points, t, "rollouts") for r in theirs})) for t in targets]  # fmt: skip


def decompose(reference_runs: list[Run], equal_runs: list[Run] | None = None,
              fractions: tuple[float, ...] = TARGET_FRACTIONS) -> dict[str, Any]:  # fmt: skip
    """Per regime (of the reference runs): per target fraction, every column's ratio, and the
    seeds each label ran in each set."""
    sets = {"reference": reference_runs, "equal": equal_runs or []}
    out: dict[str, Any] = {"fractions": list(fractions), "paper": {k: list(v) for k, v in PAPER_RATIOS.items()}, "regimes": {}}
    known = list(REGIMES)
    for regime in sorted({r.regime for r in reference_runs}, key=lambda name: (known.index(name) if name in known else len(known), name)):
        per_set = {name: [r for r in runs if r.regime == regime] for name, runs in sets.items()}
        targets = {name: choose_targets(runs, fractions)["target_accuracies"] if runs else [] for name, runs in per_set.items()}
        columns: dict[str, list[dict[str, Any] | None]] = {}
        for key, _, other, ref, run_set in COLUMNS:
            wanted = targets[run_set]
            columns[key] = _ratios(per_set[run_set], other, ref, wanted) if len(wanted) == len(fractions) else [None] * len(fractions)
        seeds = {name: {label: sorted(r.seed for r in runs if r.strategy == label) for label in sorted({r.strategy for r in runs})}
                 for name, runs in per_set.items() if runs}  # fmt: skip
        out["regimes"][regime] = {"targets": targets, "columns": columns, "seeds": seeds}
    return out


def _cell(entry: dict[str, Any] | None) -> str:
    if entry is None:
        return "-"
    if entry["ratio"] is None:
        return {"reference_only": "ref. only", "other_only": "other only"}.get(entry["status"], "neither")
    lo, hi = entry["seed_min"], entry["seed_max"]
    span = f" [{lo:.2f}-{hi:.2f}]" if lo is not None and hi is not None else ""
    return f"{entry['ratio']:.2f}x{span}"


def markdown(table: dict[str, Any]) -> str:
    """The decomposition as a markdown section."""
    grpo, dapo = (f"{a}-{b}x" for a, b in (table["paper"]["grpo"], table["paper"]["dapo"]))
    lines = ["## Where the paper's gain comes from", "",
             f"Rollouts to each target, the named strategy over the one after the slash (above 1: the latter needed fewer); "
             f"medians over seeds, [per-seed range]. The paper: GRPO/PC {grpo}, DAPO/PC {dapo}. "
             "Each set of runs has its own targets (25/50/75% of its smallest final gain). '-': no runs of that column.", ""]  # fmt: skip
    heads = [h for _, h, *_ in COLUMNS]
    for regime, entry in table["regimes"].items():
        lines += [f"### {regime}", "", "| target | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads)]
        for i, fraction in enumerate(table["fractions"]):
            lines.append(f"| {fraction:.0%} | " + " | ".join(_cell(entry["columns"][key][i]) for key, *_ in COLUMNS) + " |")
        seeds = "; ".join(f"{name}: " + ", ".join(f"{label} {len(s)}" for label, s in labels.items()) for name, labels in entry["seeds"].items())
        lines += ["", f"Seeds per label: {seeds}.", ""]
    if table.get("equal_left_out"):
        lines += [f"The 1-update runs of {', '.join(table['equal_left_out'])} are left out: they did not start from the "
                  "model the recipe-rule runs recorded (REGIME/start_model.json).", ""]
    return "\n".join(lines)


def equal_runs_from(directories: list[str], bench_dir: str | Path) -> tuple[list[Run], list[str]]:
    """The 1-update runs of ``directories`` whose regime started from the model ``bench_dir``
    recorded, and ``REGIME (DIR)`` for each regime left out because it did not."""
    equal: list[Run] = []
    left_out: list[str] = []
    for directory in directories:
        kept, dropped = same_start(find_runs(directory), directory, bench_dir)
        equal += kept
        left_out += [f"{regime} ({directory})" for regime in dropped]
    return equal, left_out


def main(argv: list[str] | None = None) -> int:
    """``megatron-pc decompose BENCH_DIR [--equal-runs DIR...] [--out DIR]``."""
    parser = argparse.ArgumentParser(prog="megatron-pc decompose", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("bench_dir", help="a `bench rollouts --update-rule reference --variants ...` output (or its kept results)")
    parser.add_argument("--equal-runs", nargs="+", default=[], metavar="DIR",
                        help="benchmarks of 1 update a step over the same regimes (e.g. results/bench_rollouts results/bench_equal1)")
    parser.add_argument("--out", default="decomposition", help="where decomposition.md and decomposition.json go")
    parser.add_argument("--target-fractions", default=",".join(map(str, TARGET_FRACTIONS)))
    args = parser.parse_args(argv)
    fractions = parse_fractions(args.target_fractions)
    equal, left_out = equal_runs_from(args.equal_runs, args.bench_dir)
    table = decompose(find_runs(args.bench_dir), equal, fractions)
    table["equal_left_out"] = left_out
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(table)
    (out / "decomposition.md").write_text(text + "\n")
    tmp = out / "decomposition.json.tmp"
    tmp.write_text(json.dumps(table, indent=1) + "\n")
    tmp.replace(out / "decomposition.json")
    print(text)
    return 0
