#!/usr/bin/env python3
"""What each strategy trained on, from its runs' traces: how many informative groups, on how many
prompts, how concentrated, and how hard.

    .venv/bin/python scripts/trained_groups.py BENCH_DIR/REGIME [--top 20]

BENCH_DIR/REGIME is a regime folder of `megatron-pc bench rollouts` (LABEL[@RULE]/seed_K/trace.jsonl,
or trace.jsonl.gz; finished runs only, those with seed_K.wall.json beside them). An informative group is a trained group whose rewards differ (0 < successes <
size: the only kind that moves a GRPO-family update). Per label, the range over its seeds of:
informative groups trained; distinct prompts among them; the share of those groups on the label's
--top most trained prompts; and their mean success rate (successes / size). Prints a markdown table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from megatron_pc.errors import MegatronPCError
from megatron_pc.jsonl import find, iter_jsonl


def informative_groups(trace: Path) -> list[tuple[int, float]]:
    """(prompt, success rate) of every trained group with differing rewards, in the trace's order."""
    out = []
    try:
        events = list(iter_jsonl(trace))
    except json.JSONDecodeError as err:
        raise MegatronPCError(f"{trace}: not JSON lines ({err})") from None
    for i, event in enumerate(events, start=1):
        if event.get("event") != "train_group":
            continue
        try:
            size, successes, prompt = int(event["size"]), int(event["successes"]), int(event["prompt"])
        except (KeyError, TypeError, ValueError) as err:
            raise MegatronPCError(f"{trace}: line {i}: a train_group event without a whole size, successes and prompt ({err})") from None
        if 0 < successes < size:
            out.append((prompt, successes / size))
    return out


def run_figures(groups: list[tuple[int, float]], top: int) -> dict[str, float]:
    counts = Counter(prompt for prompt, _ in groups)
    most = sum(n for _, n in counts.most_common(top))
    return {"groups": len(groups), "prompts": len(counts), "top_share": most / len(groups) if groups else 0.0,
            "mean_success": statistics.fmean(p for _, p in groups) if groups else 0.0}  # fmt: skip


def _range(values: list[float], fmt: str) -> str:
    low, high = format(min(values), fmt), format(max(values), fmt)
    return low if low == high else f"{low}-{high}"


def table(regime_dir: Path, top: int = 20) -> str:
    by_label: dict[str, list[dict[str, Any]]] = {}
    for run in sorted(regime_dir.glob("*/seed_*")):
        if not run.is_dir() or not run.with_name(f"{run.name}.wall.json").is_file():
            continue  # not finished (the benchmark writes seed_K.wall.json when a run ends)
        trace = find(run / "trace.jsonl")
        if trace is None:
            raise MegatronPCError(f"{run}: no trace.jsonl (or trace.jsonl.gz): the run has no trace to read")
        by_label.setdefault(run.parent.name.split("@")[0], []).append(run_figures(informative_groups(trace), top))
    if not by_label:
        raise MegatronPCError(f"{regime_dir}: no runs (LABEL/seed_K) under it")
    lines = [f"| label | seeds | informative groups trained | distinct prompts among them | share on the {top} most trained prompts | their mean success rate |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for label in sorted(by_label):
        rows = by_label[label]
        lines.append(f"| {label} | {len(rows)} | {_range([r['groups'] for r in rows], 'd')} | {_range([r['prompts'] for r in rows], 'd')} | "
                     f"{_range([r['top_share'] for r in rows], '.2f')} | {_range([r['mean_success'] for r in rows], '.2f')} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("regime_dir", type=Path, help="BENCH_DIR/REGIME of `megatron-pc bench rollouts`")
    parser.add_argument("--top", type=int, default=20, help="how many of the most trained prompts the concentration counts (default 20)")
    args = parser.parse_args(argv)
    try:
        if args.top < 1:
            raise MegatronPCError(f"--top: must be >= 1, got {args.top}")
        print(table(args.regime_dir, args.top))
    except MegatronPCError as err:
        print(f"trained_groups: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
