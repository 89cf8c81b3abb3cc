"""A deterministic stand-in for the policy at the engine edge: prompt i succeeds with a fixed
probability, and each rollout's outcome is a pure function of (seed, step, round, prompt, k),
so two runs that make the same decisions see the same rewards."""

from __future__ import annotations

import random
from typing import Any, Callable

from hypothesis import strategies as st

from megatron_pc.allocation import AllocationStrategy, Rollout, RoundPlan, StepResult
from megatron_pc.allocation.config import AllocationConfig, BufferConfig, HistoryConfig, PilotConfig


class BernoulliPolicy:
    """Prompt ``i`` is solved with probability ``rates[i]``."""

    def __init__(self, rates: list[float], seed: int = 0) -> None:
        self.rates = rates
        self.seed = seed

    def generate(self, plan: RoundPlan) -> list[list[Rollout]]:
        """Rewarded rollouts for every request of the plan, in order."""
        out = []
        for i, req in enumerate(plan.requests):
            rng = random.Random(hash((self.seed, plan.step, plan.round, i, req.prompt)))
            wins = [rng.random() < self.rates[req.prompt] for _ in range(req.n)]
            out.append([Rollout(float(w), w, {"prompt": req.prompt, "k": k}) for k, w in enumerate(wins)])
        return out


def run_steps(strategy: AllocationStrategy, policy: BernoulliPolicy, steps: int) -> list[StepResult]:
    """Drive ``steps`` steps the way the trainer does."""
    results = []
    for _ in range(steps):
        while not strategy.batch_ready():
            plan = strategy.plan_round()
            strategy.observe(plan, policy.generate(plan))
        results.append(strategy.finish_step())
    return results


def run_with_features(strategy: AllocationStrategy, policy: BernoulliPolicy, source: Any, steps: int) -> list[StepResult]:
    """Drive ``steps`` steps the way the trainer does, features handed over before every round
    (``source`` None: none, as for a strategy that asks for none)."""
    from megatron_pc.allocation.feature_sources import supply_features

    results = []
    for _ in range(steps):
        while not strategy.batch_ready():
            supply_features(strategy, source, strategy.step)
            plan = strategy.plan_round()
            strategy.observe(plan, policy.generate(plan))
        results.append(strategy.finish_step())
    return results


def spread_rates(size: int, seed: int, easy: float = 0.2, hard: float = 0.2) -> list[float]:
    """Success rates with a share of always-solved and never-solved prompts, the rest uniform."""
    rng = random.Random(seed)
    rates: list[Any] = []
    for _ in range(size):
        u = rng.random()
        rates.append(1.0 if u < easy else 0.0 if u < easy + hard else rng.random())
    return rates


def draw_pilot_commit(draw: st.DrawFn, history: Callable[[st.DrawFn], HistoryConfig]) -> tuple[AllocationConfig, int]:
    """A Pilot-Commit configuration as the property tests draw it (group sizes, band, buffer),
    with the history settings ``history(draw)`` gives, and a pool size that suits it."""
    train_batch = draw(st.integers(2, 10))
    pilot_n = draw(st.integers(2, 8))
    kept = draw(st.integers(1, pilot_n))
    commit_n = draw(st.integers(1, 8))
    cfg = AllocationConfig(
        strategy="pilot_commit",
        train_batch=train_batch,
        n=kept + commit_n,
        pilot=PilotConfig(n=pilot_n, n_effective=kept, batch=draw(st.integers(train_batch, 3 * train_batch))),
        p_lower=draw(st.sampled_from([0.0, 0.125, 0.25])),
        p_upper=draw(st.sampled_from([0.5, 0.75, 1.0])),
        p_evict=draw(st.sampled_from([0.75, 1.0])),
        buffer=BufferConfig(max_age=draw(st.integers(0, 4)), age_rule=draw(st.sampled_from(["strict", "reference"]))),
        history=history(draw),
        max_rounds=10,
        on_round_limit="train_partial",
    )
    return cfg, draw(st.integers(max(40, 3 * train_batch), 12 * train_batch + 60))


def assert_step_accounting(results: list[StepResult], events: list[dict[str, Any]], cfg: AllocationConfig) -> None:
    """Every step's rollouts add up and its groups are whole and distinct; the run's counters
    equal what the trace says was generated, screened and trained."""
    for r in results:
        m = r.metrics
        assert m["generated"] == m["generated_pilot"] + m["generated_commit"] + m["generated_full"]
        assert len(r.groups) <= cfg.train_batch and len({g.prompt for g in r.groups}) == len(r.groups)
        sizes = {cfg.n, cfg.history.large_factor * cfg.n} if cfg.history.sized else {cfg.n}  # sized counts: a larger group too
        assert all(g.size in sizes for g in r.groups)
    last = results[-1].metrics
    assert last["cum_generated_pilot"] == sum(e["n"] for e in events if e["event"] == "pilot")
    assert last["cum_generated_commit"] == sum(e["n"] for e in events if e["event"] == "commit")
    assert last["cum_generated_full"] == sum(e["n"] for e in events if e["event"] == "direct")
    assert last["cum_prompts_screened"] == sum(1 for e in events if e["event"] == "screen")
    assert last["cum_trained_rollouts"] == sum(e["size"] for e in events if e["event"] == "train_group")
