"""``megatron-pc bench step``: per-step throughput and rollout accounting of real training runs,
one per strategy, under the same configuration.

Each strategy runs ``megatron-pc train CONFIG allocation.strategy=S training.steps=N`` into
``--out/S`` (a finished run there is resumed, i.e. read again, not redone), then its
metrics.jsonl is summarised: the median step time and its phases, rollouts generated per step
and how many of them were trained on, generation tokens/s, the sync share of a step, and
validation accuracy against cumulative rollouts. The comparison that matters is the last
one: the rollouts each strategy generated to first reach an accuracy every strategy reached
(``--target``, default: the lowest of the strategies' best validation accuracies).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from megatron_pc.errors import MegatronPCError
from megatron_pc.metrics.logger import read_metrics

STRATEGIES = ("pilot_commit", "grpo", "dapo")
PHASES = ("generate", "reward", "logprob", "reference", "update", "sync", "sync_check")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megatron-pc bench step", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("config", nargs="?", default="configs/tiny_cpu.yaml", help="experiment YAML (default: the tiny CPU run)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every strategy, e.g. training.lr=1e-4")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated, from " + ", ".join(STRATEGIES))
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default: the config's)")
    parser.add_argument("--out", default="runs/bench_step", help="run directories go to OUT/STRATEGY")
    parser.add_argument("--target", type=float, default=None, help="validation accuracy to count rollouts to")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    return parser


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The options; CONFIG may be omitted (a first argument with '=' is an override) and the
    overrides may come before or after the options."""
    from megatron_pc.config_cli import split_config_args

    args = _parser().parse_intermixed_args(argv)
    config, args.overrides = split_config_args(args.config, args.overrides)
    args.config = config or "configs/tiny_cpu.yaml"
    return args


def run_strategy(config: str, strategy: str, overrides: list[str], steps: int | None, run_dir: Path) -> float:
    """Train one strategy into ``run_dir`` (its log in ``run_dir``.log); wall seconds."""
    cmd = [sys.executable, "-m", "megatron_pc", "train", config, f"allocation.strategy={strategy}", f"run_dir={run_dir}",
           "logging.progress=false", *overrides, *([f"training.steps={steps}"] if steps is not None else [])]  # fmt: skip
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{run_dir.name}.log"
    print(f"bench step: {strategy}: training into {run_dir} (log {log})", file=sys.stderr, flush=True)
    start = time.perf_counter()
    with open(log, "w") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if code != 0:
        tail = log.read_text()[-3000:]
        raise MegatronPCError(f"{strategy}: `megatron-pc train` exited {code}; the end of {log}:\n{tail}")
    return time.perf_counter() - start


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures of one run from its metrics rows (step 0 is the validation before training)."""
    steps = [r for r in rows if r["step"] > 0]
    if not steps:
        raise MegatronPCError("the run has no training steps in its metrics.jsonl")
    last = steps[-1]
    total = statistics.median(r["time_total"] for r in steps)
    phases = {p: statistics.median(r.get(f"time_{p}", 0.0) for r in steps) for p in PHASES}
    validated = [(r["step"], r.get("cum_generated", 0), r["val_accuracy"]) for r in rows if "val_accuracy" in r]
    return {
        "steps": last["step"],
        "step_seconds": total,
        "phase_seconds": {p: s for p, s in phases.items() if s > 0},
        "sync_share": phases["sync"] / total if total else 0.0,
        "rollouts_per_step": statistics.median(r["generated"] for r in steps),
        "rollouts": last["cum_generated"],
        "trained_rollouts": last["cum_trained_rollouts"],
        "trained_share": last["cum_trained_rollouts"] / last["cum_generated"] if last["cum_generated"] else 0.0,
        "gen_tokens_per_s": statistics.median(r["gen_tokens_per_s"] for r in steps if "gen_tokens_per_s" in r),
        "rollouts_per_s": statistics.median(r["generated"] / r["time_total"] for r in steps if r["time_total"] > 0),
        "validation": [{"step": s, "rollouts": c, "accuracy": a} for s, c, a in validated],
    }


def rollouts_to_reach(validation: list[dict[str, Any]], target: float) -> int | None:
    """Cumulative rollouts at the first validation with accuracy >= target (None: never)."""
    return next((v["rollouts"] for v in validation if v["accuracy"] >= target), None)


def main(argv: list[str] | None = None) -> int:
    """Run every strategy, print the comparison."""
    args = parse_args(argv)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    unknown = [s for s in strategies if s not in STRATEGIES]
    if unknown or not strategies:
        raise MegatronPCError(f"--strategies: unknown {unknown or 'none given'}; choose from {', '.join(STRATEGIES)}")
    from megatron_pc.config import load_config

    for strategy in strategies:  # refuse a bad config before any run starts
        load_config(args.config, [f"allocation.strategy={strategy}", *args.overrides])
    figures: dict[str, Any] = {}
    for strategy in strategies:
        run_dir = Path(args.out).resolve() / strategy
        wall = run_strategy(args.config, strategy, args.overrides, args.steps, run_dir)
        figures[strategy] = {**summarise(read_metrics(run_dir / "metrics.jsonl")), "wall_seconds": wall, "run_dir": str(run_dir)}
    target = args.target
    if target is None:
        target = min(max((v["accuracy"] for v in f["validation"]), default=0.0) for f in figures.values())
    for f in figures.values():
        f["rollouts_to_target"] = rollouts_to_reach(f["validation"], target)
    result = {"config": args.config, "overrides": args.overrides, "target_accuracy": target, "strategies": figures}
    print(json.dumps(result, indent=2) if args.json else _tables(result))
    return 0


def _tables(result: dict[str, Any]) -> str:
    figures = result["strategies"]
    lines = [f"config {result['config']} {' '.join(result['overrides'])}".rstrip(), "",
             "| strategy | steps | s/step | sync share | rollouts/step | rollouts/s | gen tok/s | rollouts | trained share |",
             "|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for name, f in figures.items():
        lines.append(f"| {name} | {f['steps']} | {f['step_seconds']:.2f} | {100 * f['sync_share']:.1f}% | {f['rollouts_per_step']:.0f} | "
                     f"{f['rollouts_per_s']:.0f} | {f['gen_tokens_per_s']:.0f} | {f['rollouts']} | {f['trained_share']:.2f} |")  # fmt: skip
    lines += ["", "median seconds per phase: " + "; ".join(
        f"{name} " + ", ".join(f"{p} {s:.2f}" for p, s in f["phase_seconds"].items()) for name, f in figures.items())]  # fmt: skip
    lines += ["", f"validation accuracy against cumulative rollouts (target {result['target_accuracy']:.3f}):"]
    for name, f in figures.items():
        val = f["validation"]
        first, best = val[0]["accuracy"] if val else float("nan"), max((v["accuracy"] for v in val), default=float("nan"))
        reach = f["rollouts_to_target"]
        lines.append(f"  {name}: {first:.3f} -> {val[-1]['accuracy'] if val else float('nan'):.3f} (best {best:.3f}); "
                     f"rollouts to target: {reach if reach is not None else 'not reached'}")  # fmt: skip
    reached = {n: f["rollouts_to_target"] for n, f in figures.items() if f["rollouts_to_target"]}
    if "pilot_commit" in reached:
        for name, count in reached.items():
            if name != "pilot_commit":
                lines.append(f"  {name} / pilot_commit rollouts to target: {count / reached['pilot_commit']:.2f}x")
    return "\n".join(lines)
