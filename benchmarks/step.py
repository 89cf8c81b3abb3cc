"""``megatron-pc bench step``: per-step throughput and rollout accounting of real training runs,
one per strategy, under the same configuration.

Each strategy runs ``megatron-pc train CONFIG allocation.strategy=S training.steps=N`` into
``--out/S`` (a finished run there is resumed, i.e. read again, not redone), then its
metrics.jsonl is summarised: the median step time and its phases, rollouts generated per step
and how many of them were trained on, generation tokens/s, the sync share of a step, and
validation accuracy against cumulative rollouts. The comparison that matters is the last
one: the rollouts each strategy generated to first reach an accuracy every strategy reached
(``--target``, default: the lowest of the strategies' best validation accuracies).

Beside them (``--comparisons``, both by default), Pilot-Commit runs again under the same config:
* ``binding``: with ``allocation.binding=false`` (a round's new prompts and commits in two engine
  calls). ``binding_gain`` = generation seconds per step without binding / with it (above 1:
  binding saves time).
* ``pipelined``: in split placement, synchronous and then with ``training.pipelined=true``.
  ``pipelined_speedup`` = seconds per step synchronous / pipelined; the goal is a pipelined step
  within 1.15x of max(generation, training) of the synchronous one, not their sum.

Every run's MFU per phase (:mod:`megatron_pc.metrics.mfu`): the median over steps of each
phase's analytic FLOPs over its seconds times the peak of the devices it ran on (on CPU the
matmul probe's FLOP/s of the cores the phase had).
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

from megatron_pc.analysis.runs import relative_path
from benchmarks.options import parse_names
from megatron_pc.errors import MegatronPCError
from megatron_pc.metrics.logger import read_metrics
from megatron_pc.metrics.phases import BREAKDOWN_PHASES

STRATEGIES = ("pilot_commit", "grpo", "dapo")
COMPARISONS: dict[str, dict[str, tuple[str, ...]]] = {
    "binding": {"pilot_commit_unbound": ("allocation.binding=false",)},
    "pipelined": {"pilot_commit_split": ("cluster.placement=split",),
                  "pilot_commit_pipelined": ("cluster.placement=split", "training.pipelined=true")},
}  # fmt: skip
"""Extra Pilot-Commit runs per comparison: label -> overrides."""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megatron-pc bench step", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("config", nargs="?", default="configs/tiny_cpu.yaml", help="experiment YAML (default: the tiny CPU run)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for every strategy, e.g. training.lr=1e-4")
    parser.add_argument("--strategies", default=",".join(STRATEGIES), help="comma-separated, from " + ", ".join(STRATEGIES))
    parser.add_argument("--steps", type=int, default=None, help="training steps per run (default: the config's)")
    parser.add_argument("--out", default="runs/bench_step", help="run directories go to OUT/STRATEGY")
    parser.add_argument("--target", type=float, default=None, help="validation accuracy to count rollouts to")
    parser.add_argument("--comparisons", default=",".join(COMPARISONS), help=f"comma-separated from {', '.join(COMPARISONS)}, or none")
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
    # Relative to the working directory (the repository root) when inside it, so kept configs
    # name no machine's absolute prefix.
    cmd = [sys.executable, "-m", "megatron_pc", "train", config, f"allocation.strategy={strategy}", f"run_dir={relative_path(run_dir)}",
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


def run_mfu(rows: list[dict[str, Any]], cfg: Any, peak: dict[str, Any]) -> dict[str, float]:
    """Median MFU of each phase over a run's steps, against the peak of the devices (GPUs, or CPU
    threads) the phase ran on."""
    from megatron_pc.models.shapes import load_model_shape
    from megatron_pc.metrics.mfu import step_mfu

    shape = load_model_shape(str(cfg.model.path))
    units = phase_units(cfg, peak["unit"])
    per_phase: dict[str, list[float]] = {}
    for r in rows:
        if r.get("step", 0) > 0:
            for phase, value in step_mfu(shape, r, 1.0).items():
                devices = units["generate" if phase == "generate" else "policy"]
                per_phase.setdefault(phase, []).append(value / (peak["flops"] * devices))
    return {phase: statistics.median(values) for phase, values in per_phase.items()}


def phase_units(cfg: Any, unit: str) -> dict[str, int]:
    """GPUs (or CPU threads) the engines and the policy ranks use."""
    import os

    engines = cfg.rollout.engines * cfg.rollout.tensor_parallel
    world = cfg.policy_world
    if unit == "gpu":
        return {"generate": engines, "policy": world}
    from megatron_pc.cluster.placement import cpu_threads

    threads = cpu_threads(cfg.cluster, cfg.layout, len(os.sched_getaffinity(0)))
    return {"generate": engines * threads["engine"], "policy": world * threads["policy"]}


def device_peak() -> dict[str, Any]:
    """Peak FLOP/s of one GPU from the table, else of one CPU thread by the matmul probe."""
    from megatron_pc import platform
    from megatron_pc.metrics.mfu import cpu_peak_flops, gpu_peak_flops

    if platform.on_gpu():
        name = platform.device_name()
        flops = gpu_peak_flops(name)
        if flops is None:
            raise MegatronPCError(f"no peak FLOP/s known for {name!r} (megatron_pc.metrics.mfu.PEAK_TFLOPS); MFU cannot be computed")
        return {"device": name, "unit": "gpu", "flops": flops, "source": "data sheet, dense bf16, per GPU"}
    return {"device": "CPU", "unit": "thread", "flops": cpu_peak_flops(1), "source": "fp32 matmul probe, per thread"}


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Figures of one run from its metrics rows (step 0 is the validation before training)."""
    steps = [r for r in rows if r["step"] > 0]
    if not steps:
        raise MegatronPCError("the run has no training steps in its metrics.jsonl")
    last = steps[-1]
    total = statistics.median(r["time_total"] for r in steps)
    phases = {p: statistics.median(r.get(f"time_{p}", 0.0) for r in steps) for p in BREAKDOWN_PHASES}
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
        "generate_calls": statistics.median(r.get("generate_calls", r.get("rounds", 0)) for r in steps),
        "policy_lag": max((r.get("policy_lag", 0) for r in steps), default=0),
        "rollout_age_max": max((r.get("rollout_age_max", 0) for r in steps), default=0),
        "rollouts_per_s": statistics.median(r["generated"] / r["time_total"] for r in steps if r["time_total"] > 0),
        "validation": [{"step": s, "rollouts": c, "accuracy": a} for s, c, a in validated],
    }


def rollouts_to_reach(validation: list[dict[str, Any]], target: float) -> int | None:
    """Cumulative rollouts at the first validation with accuracy >= target (None: never)."""
    return next((v["rollouts"] for v in validation if v["accuracy"] >= target), None)


def main(argv: list[str] | None = None) -> int:
    """Run every strategy (and the comparisons), print the figures."""
    args = parse_args(argv)
    strategies = parse_names(args.strategies, "strategies", STRATEGIES)
    comparisons = parse_names(args.comparisons, "comparisons", COMPARISONS, or_none=True)
    from megatron_pc.config import load_config

    runs = [(s, s, ()) for s in strategies] + [(label, "pilot_commit", more) for c in comparisons for label, more in COMPARISONS[c].items()]
    configs = {label: load_config(args.config, [f"allocation.strategy={s}", *args.overrides, *more]) for label, s, more in runs}  # refuse a bad config first
    peak = device_peak()
    figures: dict[str, Any] = {}
    for label, strategy, more in runs:
        run_dir = Path(args.out).resolve() / label
        wall = run_strategy(args.config, strategy, [*args.overrides, *more], args.steps, run_dir)
        rows = read_metrics(run_dir / "metrics.jsonl")
        figures[label] = {**summarise(rows), "wall_seconds": wall, "run_dir": str(run_dir), "mfu": run_mfu(rows, configs[label], peak)}
    target = args.target
    if target is None:
        target = min(max((v["accuracy"] for v in figures[s]["validation"]), default=0.0) for s in strategies)
    for f in figures.values():
        f["rollouts_to_target"] = rollouts_to_reach(f["validation"], target)
    result = {"config": args.config, "overrides": args.overrides, "target_accuracy": target, "strategies": figures, "peak": peak,
              "mfu": {label: f["mfu"] for label, f in figures.items()}, **comparison_figures(figures)}  # fmt: skip
    print(json.dumps(result, indent=2) if args.json else _tables(result))
    return 0


def comparison_figures(figures: dict[str, Any]) -> dict[str, Any]:
    """binding_gain and pipelined_speedup (None where not measured), and what they rest on."""
    out: dict[str, Any] = {"binding_gain": None, "pipelined_speedup": None}
    bound, unbound = figures.get("pilot_commit"), figures.get("pilot_commit_unbound")
    if bound and unbound and bound["phase_seconds"].get("generate"):
        out["binding_gain"] = unbound["phase_seconds"]["generate"] / bound["phase_seconds"]["generate"]
        out["binding"] = {"generate_seconds_bound": bound["phase_seconds"]["generate"], "generate_seconds_unbound": unbound["phase_seconds"]["generate"],
                          "calls_per_step_bound": bound["generate_calls"], "calls_per_step_unbound": unbound["generate_calls"]}  # fmt: skip
    sync, piped = figures.get("pilot_commit_split"), figures.get("pilot_commit_pipelined")
    if sync and piped and piped["step_seconds"]:
        phases = sync["phase_seconds"]
        generation = phases.get("generate", 0.0) + phases.get("reward", 0.0)
        training = sync["step_seconds"] - generation
        out["pipelined_speedup"] = sync["step_seconds"] / piped["step_seconds"]
        out["pipelined"] = {"sync_step_seconds": sync["step_seconds"], "pipelined_step_seconds": piped["step_seconds"],
                            "generation_seconds": generation, "training_seconds": training,
                            "over_max_of_generation_and_training": piped["step_seconds"] / max(generation, training, 1e-9),
                            "policy_lag": piped["policy_lag"], "rollout_age_max": piped["rollout_age_max"]}  # fmt: skip
    return out


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
    peak = result["peak"]
    lines += ["", f"MFU per phase (median over steps; peak {peak['flops'] / 1e9:,.1f} GFLOP/s, {peak['device']}, {peak['source']}):"]
    for name, mfu in result["mfu"].items():
        lines.append(f"  {name}: " + ", ".join(f"{p} {100 * v:.2f}%" for p, v in mfu.items()))
    if result["binding_gain"] is not None:
        b = result["binding"]
        lines += ["", f"binding gain: {result['binding_gain']:.2f}x (generation s/step without binding {b['generate_seconds_unbound']:.2f} "
                  f"in {b['calls_per_step_unbound']:.0f} calls / with {b['generate_seconds_bound']:.2f} in {b['calls_per_step_bound']:.0f})"]  # fmt: skip
    if result["pipelined_speedup"] is not None:
        p = result["pipelined"]
        lines += ["", f"pipelined speedup (split placement): {result['pipelined_speedup']:.2f}x (s/step synchronous {p['sync_step_seconds']:.2f}, "
                  f"pipelined {p['pipelined_step_seconds']:.2f}; generation {p['generation_seconds']:.2f} + training {p['training_seconds']:.2f}: "
                  f"pipelined is {p['over_max_of_generation_and_training']:.2f}x their max, goal <= 1.15x; rollouts at most "
                  f"{p['rollout_age_max']} steps old)"]  # fmt: skip
    reached = {n: f["rollouts_to_target"] for n, f in figures.items() if f["rollouts_to_target"]}
    if "pilot_commit" in reached:
        for name, count in reached.items():
            if name != "pilot_commit":
                lines.append(f"  {name} / pilot_commit rollouts to target: {count / reached['pilot_commit']:.2f}x")
    return "\n".join(lines)
