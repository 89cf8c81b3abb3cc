"""``megatron-pc bench controller``: how long the controller needs for one reference-size round.

Reference sizes (PILOT_COMMIT.md): a pool of 100,000 prompts, train batch 128, n = 128
(pilot 32 + commit 96), pilot batch 384. A steady-state round plans 384 pilots x 32 rollouts
and 128 commits x 96, then observes all 24,576 rewarded rollouts. Rollouts are made before
the clock starts; plan_round, observe and (when the batch fills) finish_step are timed.
Goal: under 20 ms per round. ``--history`` times history-aware Pilot-Commit (the preset) as in a
later epoch: every prompt of the pool already has a history, so each one drawn is judged by its
own posterior, on a pool where 40% of the prompts are never solved and 10% always (most drawn
prompts are then screened, the costliest case). ``--screen`` times the screen (preset ``screen``,
docs/screen.md) in a first epoch, where no prompt has a history and every prediction comes from
the features: 256 precomputed features per prompt (one of them a noisy view of its success
rate), handed over before each round as the driver does; the time to take them in, the step's
refit of the predictor and the predictions are all counted.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import numpy as np

from megatron_pc.allocation import Rollout, build_strategy
from megatron_pc.allocation.config import AllocationConfig, HistoryConfig, PilotConfig
from megatron_pc.allocation.feature_sources import supply_features

SCREEN_FEATURES = 256


def _reference_config(rounds: int, history: bool, screen: bool = False) -> AllocationConfig:
    # Many rounds, all trained partially filled or full: the limit must not stop the bench.
    return AllocationConfig(
        strategy="pilot_commit", train_batch=128, n=128, pilot=PilotConfig(n=32, batch=384), max_rounds=max(10, rounds),
        history=HistoryConfig(preset="screen" if screen else "history_aware" if history else "off"),
    )


def bench(rounds: int, pool_size: int, seed: int, history: bool = False, screen: bool = False) -> dict[str, float]:
    """Time ``rounds`` steady-state rounds; returns milliseconds per round (median, p90, max)."""
    cfg = _reference_config(rounds, history, screen)
    strategy = build_strategy(cfg, pool_size, seed)
    rng = random.Random(seed)
    rates = [rng.random() for _ in range(pool_size)]
    source = None
    if screen:  # a first epoch: no history; features precomputed, one of them a noisy view of the rate
        rates = [0.0 if u < 0.4 else 1.0 if u < 0.5 else rng.random() for u in (rng.random() for _ in range(pool_size))]
        gen = np.random.default_rng(seed)
        table = gen.normal(0.0, 1.0 / np.sqrt(SCREEN_FEATURES), (pool_size, SCREEN_FEATURES))
        table[:, 0] = np.asarray(rates) + gen.normal(0.0, 0.15, pool_size)
        source = lambda ids: {p: table[p] for p in ids}  # noqa: E731
    elif history:
        rates = [0.0 if u < 0.4 else 1.0 if u < 0.5 else rng.random() for u in (rng.random() for _ in range(pool_size))]  # a later epoch: one earlier pilot of every prompt is remembered
        for prompt, rate in enumerate(rates):
            strategy.history.observe(prompt, sum(rng.random() < rate for _ in range(cfg.pilot.n)), cfg.pilot.n, 0)
    timings, shapes = [], []
    for i in range(rounds + 3):
        if strategy.batch_ready():
            strategy.finish_step()
        t0 = time.perf_counter()
        supply_features(strategy, source, strategy.step)
        plan = strategy.plan_round()
        t_plan = time.perf_counter() - t0
        results = [[Rollout(1.0, True) if rng.random() < rates[r.prompt] else Rollout(0.0, False) for _ in range(r.n)] for r in plan.requests]
        t1 = time.perf_counter()
        strategy.observe(plan, results)
        if strategy.batch_ready():
            strategy.finish_step()
        elapsed = t_plan + time.perf_counter() - t1
        if i >= 3:  # the first rounds fill the buffer; time the steady state only
            timings.append(elapsed * 1e3)
            shapes.append((plan.rollouts_of("pilot"), plan.rollouts_of("commit"), plan.rollouts_of("full")))
    timings.sort()
    return {
        "rounds": rounds,
        "median_ms": statistics.median(timings),
        "p90_ms": timings[int(0.9 * (len(timings) - 1))],
        "max_ms": timings[-1],
        "pilot_rollouts_per_round": statistics.median(s[0] for s in shapes),
        "commit_rollouts_per_round": statistics.median(s[1] for s in shapes),
        "direct_rollouts_per_round": statistics.median(s[2] for s in shapes),
    }


def main(argv: list[str] | None = None) -> int:
    """Print the controller's time per reference-size round."""
    parser = argparse.ArgumentParser(prog="megatron-pc bench controller", description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--pool-size", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--history", action="store_true", help="history-aware Pilot-Commit, every prompt with a history")
    parser.add_argument("--screen", action="store_true", help="the screen's predictor (preset screen) in a first epoch, features precomputed")
    args = parser.parse_args(argv)
    r = bench(args.rounds, args.pool_size, args.seed, args.history, args.screen)
    label = " (screen)" if args.screen else " (history-aware)" if args.history else ""
    print(
        f"controller round{label} (pool {args.pool_size:,}, pilot {r['pilot_rollouts_per_round']:,.0f} + commit "
        f"{r['commit_rollouts_per_round']:,.0f} + direct {r['direct_rollouts_per_round']:,.0f} rollouts): median {r['median_ms']:.1f} ms, p90 {r['p90_ms']:.1f} ms, "
        f"max {r['max_ms']:.1f} ms over {r['rounds']} rounds (goal < 20 ms)"
    )
    return 0
