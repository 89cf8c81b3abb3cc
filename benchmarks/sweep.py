"""``megatron-pc bench sweep``: history-aware Pilot-Commit against paper Pilot-Commit, GRPO and
DAPO on the simulator, over a grid of task settings (difficulty mean and spread, pool size).

Each setting runs every strategy for ``--steps`` steps on ``--seeds`` seeds
(:mod:`megatron_pc.analysis.simulate`'s Rasch-model policy). Its targets follow the rule of
``megatron-pc bench rollouts``: the start plus fixed shares of the smallest median final gain of
pilot_commit, grpo and dapo. A setting passes a target when history-aware Pilot-Commit's median
rollouts to it are no more than the better of GRPO and paper Pilot-Commit needed on its slowest
seed (within that strategy's seed spread, or better). The table goes to stdout, and with ``--out``
to DIR/sweep.md and DIR/sweep.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from pathlib import Path
from typing import Any

from megatron_pc.analysis.report import parse_fractions, summarize
from megatron_pc.analysis.runs import HISTORY_AWARE
from megatron_pc.errors import MegatronPCError

STRATEGIES = ("pilot_commit", "grpo", "dapo", HISTORY_AWARE)
RIVALS = ("grpo", "pilot_commit")
"""History-aware Pilot-Commit must need no more rollouts than the better of these."""


def _floats(text: str, name: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise MegatronPCError(f"--{name}: {text!r} is not a comma-separated list of numbers") from None
    if not values:
        raise MegatronPCError(f"--{name}: none given")
    return values


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="megatron-pc bench sweep", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("config", nargs="?", help="experiment YAML whose allocation section is used (default: the tiny run's)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. allocation.history.explore=0.1")
    parser.add_argument("--means", default="-1,1,3", help="difficulty means (skill starts at 0)")
    parser.add_argument("--stds", default="1,3,5", help="difficulty spreads")
    parser.add_argument("--pools", default="2000,20000", help="training pool sizes")
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--validate-every", type=int, default=5)
    parser.add_argument("--target-fractions", default="0.25,0.5,0.75")
    parser.add_argument("--out", help="write sweep.md and sweep.json here")
    return parser


def run_setting(cfg: Any, mean: float, std: float, pool: int, args: argparse.Namespace, fractions: tuple[float, ...]) -> dict[str, Any]:
    """Every strategy on one setting: targets, medians and spreads, the verdict per target."""
    from benchmarks.calibration import _sim_runs
    from megatron_pc.analysis.simulate import SimConfig, SimulatedPolicy

    sim = SimConfig(pool_size=pool, validation_size=1000, difficulty_mean=mean, difficulty_std=std, target_accuracy=float("inf"),
                    max_steps=args.steps, seeds=list(range(args.seeds)), strategies=list(STRATEGIES),
                    learning="linear")  # fmt: skip  # the kept sweep (results/sweep) was run with the linear model
    reg = summarize(_sim_runs(cfg, sim, "sim", args.validate_every), fractions)["regimes"]["sim"]
    targets = []
    for frac, t in zip(reg["fractions"], reg["targets"]):
        reach = {n: t["strategies"][n]["rollouts"] for n in STRATEGIES}
        rivals = [n for n in RIVALS if reach[n]["median"] is not None]
        best = min(rivals, key=lambda n: reach[n]["median"]) if rivals else None
        mine = reach[HISTORY_AWARE]["median"]
        bound = reach[best]["max"] if best else None
        passed = mine is not None and (bound is None or mine <= bound)
        targets.append({"fraction": frac, "accuracy": t["accuracy"], "medians": {n: reach[n]["median"] for n in STRATEGIES},
                        "ranges": {n: [reach[n]["min"], reach[n]["max"]] for n in STRATEGIES}, "best_rival": best,
                        "best_over_history": reach[best]["median"] / mine if best and mine else None, "passed": passed})  # fmt: skip
    # GRPO's expected zero-variance share at the start: P(n rollouts all alike), over the pool.
    start = SimulatedPolicy(sim, 0)
    n = cfg.allocation.n
    zero_var = sum(start.p(i) ** n + (1.0 - start.p(i)) ** n for i in range(pool)) / pool
    return {"difficulty_mean": mean, "difficulty_std": std, "pool": pool, "start_accuracy": reg["start_accuracy"],
            "grpo_zero_variance_share": zero_var, "targets": targets, "passed": all(t["passed"] for t in targets) and bool(targets)}  # fmt: skip


def table(settings: list[dict[str, Any]]) -> str:
    """The sweep as markdown: one row per setting and target."""
    lines = ["| mean | std | pool | z (GRPO) | target | " + " | ".join(STRATEGIES) + " | best rival / history | passed |",
             "|" + "---|" * (7 + len(STRATEGIES))]  # fmt: skip
    for s in settings:
        for t in s["targets"]:
            cells = [f"{t['medians'][n] / 1000:.1f}k [{t['ranges'][n][0] / 1000:.1f}-{t['ranges'][n][1] / 1000:.1f}]"
                     if t["medians"][n] is not None else "not reached" for n in STRATEGIES]  # fmt: skip
            ratio = f"{t['best_over_history']:.2f}x ({t['best_rival']})" if t["best_over_history"] else "-"
            lines.append(f"| {s['difficulty_mean']:g} | {s['difficulty_std']:g} | {s['pool']:,} | {s['grpo_zero_variance_share']:.2f} | "
                         f"{t['accuracy']:.3f} ({100 * t['fraction']:.0f}%) | " + " | ".join(cells) + f" | {ratio} | {'yes' if t['passed'] else 'NO'} |")  # fmt: skip
        if not s["targets"]:
            lines.append(f"| {s['difficulty_mean']:g} | {s['difficulty_std']:g} | {s['pool']:,} | - | no gain: no targets | | | | | | NO |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the sweep and print its table."""
    from megatron_pc.config import load_config
    from megatron_pc.config_cli import split_config_args

    args = _parser().parse_intermixed_args(argv)
    for name in ("seeds", "steps", "validate_every"):
        if getattr(args, name) < 1:
            raise MegatronPCError(f"--{name.replace('_', '-')}: must be >= 1, got {getattr(args, name)}")
    pools = [int(p) for p in _floats(args.pools, "pools")]
    grid = list(itertools.product(_floats(args.means, "means"), _floats(args.stds, "stds"), pools))
    fractions = parse_fractions(args.target_fractions)
    config, overrides = split_config_args(args.config, args.overrides)
    # A pool that runs dry (everything evicted) trains what it has, for every strategy alike.
    cfg = load_config(config, ["allocation.on_round_limit=train_partial", *overrides])
    t0, settings = time.perf_counter(), []
    for i, (mean, std, pool) in enumerate(grid, 1):
        settings.append(run_setting(cfg, mean, std, pool, args, fractions))
        s = settings[-1]
        print(f"bench sweep [{i}/{len(grid)}] mean {mean:g}, std {std:g}, pool {pool:,}: {'passed' if s['passed'] else 'FAILED'} "
              f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)  # fmt: skip
    text = table(settings)
    passed = sum(s["passed"] for s in settings)
    summary = f"{passed}/{len(settings)} settings passed every target ({args.seeds} seeds, {args.steps} steps, {time.perf_counter() - t0:.0f} s)"
    print(text + "\n\n" + summary)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "sweep.md").write_text(f"# History-aware Pilot-Commit on the simulator\n\n{text}\n\n{summary}\n")
        (out / "sweep.json").write_text(json.dumps({"settings": settings, "seeds": args.seeds, "steps": args.steps}, indent=1) + "\n")
    return 0
