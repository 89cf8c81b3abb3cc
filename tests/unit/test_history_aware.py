"""History-aware Pilot-Commit (allocation.history): the posterior maths, each option's behaviour,
and every allocation invariant with the options on, resume included."""

from __future__ import annotations

import json
import math
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_pc.allocation import build_strategy
from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.config import AllocationConfig, HistoryConfig, PilotConfig
from megatron_pc.allocation.history import JEFFREYS, PromptHistory, beta_binomial_pmf, beta_sf
from megatron_pc.allocation.trace import ListTrace
from megatron_pc.errors import ConfigError

from allocation_helpers import BernoulliPolicy, assert_step_accounting, draw_pilot_commit, run_steps, spread_rates

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
OPTIONS = ("demand_pilots", "screen", "direct_commit", "posterior_evict")


# ---- the maths --------------------------------------------------------------------------
@pytest.mark.parametrize("a,b", [(0.5, 0.5), (2.0, 5.0), (0.3, 7.0), (40.0, 3.0), (1.0, 1.0)])
def test_beta_tail_matches_numerical_integration(a: float, b: float) -> None:
    # Midpoint rule on a fine grid (the density is integrable at the ends for a, b > 0).
    grid = 200_000
    log_norm = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b)
    density = [math.exp(log_norm + (a - 1) * math.log(x) + (b - 1) * math.log1p(-x)) for x in ((i + 0.5) / grid for i in range(grid))]
    for level in (0.05, 0.3, 0.5, 0.9):
        numeric = sum(density[int(level * grid):]) / grid
        assert beta_sf(level, a, b) == pytest.approx(numeric, abs=2e-3 if min(a, b) < 1 else 2e-4)
    assert beta_sf(0.0, a, b) == 1.0 and beta_sf(1.0, a, b) == 0.0


def test_beta_binomial_is_a_distribution_and_tends_to_the_binomial() -> None:
    for n, a, b in ((4, 0.5, 0.5), (16, 0.3, 0.8), (7, 3.0, 2.0)):
        assert sum(beta_binomial_pmf(n, a, b)) == pytest.approx(1.0)
    # A very confident Beta at p = 0.3 predicts Binomial(8, 0.3).
    pmf = beta_binomial_pmf(8, 0.3 * 1e6, 0.7 * 1e6)
    for k, q in enumerate(pmf):
        assert q == pytest.approx(math.comb(8, k) * 0.3**k * 0.7 ** (8 - k), rel=1e-3)


def test_the_population_prior_recovers_a_u_shaped_pool() -> None:
    rng = random.Random(0)
    history = PromptHistory(half_life=1e9)
    assert history.prior(0) == JEFFREYS  # nothing seen yet
    for prompt in range(4000):
        p = rng.betavariate(0.3, 0.6)
        history.observe(prompt, sum(rng.random() < p for _ in range(8)), 8, step=1)
    a, b = history.prior(1)
    assert a / (a + b) == pytest.approx(0.3 / 0.9, abs=0.02)
    assert a + b == pytest.approx(0.9, rel=0.2)  # a + b < 1: the U shape is kept


def test_observations_fade_with_the_half_life() -> None:
    history = PromptHistory(half_life=10)
    history.observe(7, 8, 8, step=0)
    assert history.posterior(7, 0, (1.0, 1.0)).evidence == pytest.approx(8)
    assert history.posterior(7, 10, (1.0, 1.0)).evidence == pytest.approx(4)
    history.observe(7, 0, 4, step=20)  # 8 faded to 2 successes, plus 4 failures
    post = history.posterior(7, 20, (1.0, 1.0))
    assert (post.a, post.b) == pytest.approx((3.0, 5.0))


# ---- config -----------------------------------------------------------------------------
def test_the_preset_turns_every_option_on_and_each_is_off_by_default() -> None:
    assert not any(getattr(HistoryConfig(), o) for o in OPTIONS) and not HistoryConfig().active
    assert all(getattr(HistoryConfig(preset="history_aware"), o) for o in OPTIONS)


@pytest.mark.parametrize("field,value", [("confidence", 0.4), ("explore", 1.5), ("half_life", 0.0), ("pilot_floor", 0), ("max_new_factor", 0.5)])
def test_bad_history_settings_are_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        HistoryConfig(**{field: value})


# ---- behaviour ----------------------------------------------------------------------------
def _cfg(**history: object) -> AllocationConfig:
    return AllocationConfig(strategy="pilot_commit", train_batch=8, n=16, pilot=PilotConfig(n=4, batch=24), history=HistoryConfig(**history),
                            max_rounds=10, on_round_limit="train_partial")  # fmt: skip


def _run(cfg: AllocationConfig, rates: list[float], steps: int, seed: int = 1):
    trace = ListTrace()
    strategy = build_strategy(cfg, len(rates), seed, trace=trace)
    results = run_steps(strategy, BernoulliPolicy(rates, seed), steps)
    assert check_trace(trace.events, cfg) == []
    return strategy, results, trace.events


def test_screening_stops_piloting_prompts_that_never_land_in_the_band() -> None:
    # A third of the pool is never solved, a third always: after their first pilots they are screened.
    rates = [0.0, 1.0, 0.5] * 100
    _, results, events = _run(_cfg(screen=True, explore=0.0), rates, 120)
    piloted = {}
    for e in events:
        if e["event"] == "pilot":
            piloted[e["prompt"]] = piloted.get(e["prompt"], 0) + 1
    screened = [e for e in events if e["event"] == "screen"]
    assert screened and all(rates[e["prompt"]] != 0.5 for e in screened)
    assert {e["outcome"] for e in screened if rates[e["prompt"]] == 0.0} == {"too_hard"}
    # Without screening the hopeless prompts are piloted every epoch; with it about once or twice.
    _, _, plain = _run(_cfg(), rates, 120)
    hopeless = lambda evs: sum(1 for e in evs if e["event"] == "pilot" and rates[e["prompt"]] == 0.0)  # noqa: E731
    assert hopeless(events) < 0.5 * hopeless(plain)
    assert results[-1].metrics["cum_prompts_screened"] == len(screened)


def test_exploration_pilots_a_screened_prompt_again() -> None:
    rates = [0.0, 1.0, 0.5] * 100
    _, results, events = _run(_cfg(screen=True, explore=1.0), rates, 60)
    assert not [e for e in events if e["event"] == "screen"]
    assert results[-1].metrics["cum_prompts_explored"] > 0
    assert any(e.get("explore") for e in events if e["event"] == "pilot")


def test_posterior_eviction_needs_more_than_one_lucky_pilot() -> None:
    # Every prompt solved 70% of the time: one 4/4 pilot (chance 0.24) evicts it under the paper's
    # rule, never under the posterior's (P(p > 0.9) stays low).
    rates = [0.7] * 400
    _, plain, _ = _run(_cfg(), rates, 60)
    _, posterior, events = _run(_cfg(posterior_evict=True), rates, 60)
    assert plain[-1].metrics["cum_prompts_evicted"] > 20
    assert posterior[-1].metrics["cum_prompts_evicted"] == 0
    assert all(e["evict_prob"] < 0.9 for e in events if e["event"] == "pilot")
    # A prompt that is always solved is evicted once its evidence is strong.
    _, solved, _ = _run(_cfg(posterior_evict=True), [1.0] * 200 + [0.5] * 200, 80)
    assert solved[-1].metrics["cum_prompts_evicted"] > 0


def test_direct_commit_is_chosen_where_pilots_would_mostly_survive_and_not_on_a_polarised_pool() -> None:
    mid = [0.3 + 0.4 * (i % 10) / 10 for i in range(600)]  # every prompt half-solved: a pilot buys little
    _, results, events = _run(_cfg(direct_commit=True), mid, 60)
    m = results[-1].metrics
    assert m["cum_generated_full"] > 0.8 * m["cum_generated"]
    assert m["cum_direct_trained"] == sum(1 for e in events if e["event"] == "direct" and e["decision"] == "keep")
    # Most groups would be all alike: a new prompt is piloted first; only prompts whose own history
    # puts them in the band (the half-solved ones, in a later epoch) are given their rollouts directly.
    polarised = [0.0, 1.0, 0.0, 1.0, 0.5] * 120
    _, results, events = _run(_cfg(direct_commit=True), polarised, 30)
    first_epoch = [e for e in events if e["event"] in ("pilot", "direct") and e["step"] <= 3]
    assert first_epoch and all(e["event"] == "pilot" for e in first_epoch)
    direct = [e["prompt"] for e in events if e["event"] == "direct"]
    assert direct and all(polarised[p] == 0.5 for p in direct)


def test_demand_sized_pilots_spend_fewer_pilot_rollouts_per_trained_group() -> None:
    rates = spread_rates(2000, 3, easy=0.2, hard=0.2)
    _, fixed, _ = _run(_cfg(), rates, 80)
    _, sized, _ = _run(_cfg(demand_pilots=True), rates, 80)
    per_group = lambda r: r[-1].metrics["cum_generated"] / r[-1].metrics["cum_trained_groups"]  # noqa: E731
    assert per_group(sized) < per_group(fixed)
    assert sized[-1].metrics["cum_buffer_age_evictions"] < fixed[-1].metrics["cum_buffer_age_evictions"]
    assert sized[-1].metrics["cum_trained_groups"] >= 0.95 * fixed[-1].metrics["cum_trained_groups"]


def test_a_checkpoint_without_history_is_refused_when_history_is_on() -> None:
    plain = build_strategy(_cfg(), 300, 0)
    state = plain.state_dict()
    with pytest.raises(ValueError, match="prompt history"):
        build_strategy(_cfg(preset="history_aware"), 300, 0).load_state_dict(state)


# ---- invariants, with the options on ------------------------------------------------------
@st.composite
def history_setups(draw: st.DrawFn) -> tuple[AllocationConfig, int, int, int]:
    def history(draw: st.DrawFn) -> HistoryConfig:
        options = {o: draw(st.booleans()) for o in OPTIONS}
        return HistoryConfig(**options, explore=draw(st.sampled_from([0.0, 0.05, 0.5])), half_life=draw(st.sampled_from([2.0, 50.0])),
                             min_evidence=draw(st.sampled_from([0.0, 4.0])), pilot_floor=draw(st.integers(1, 8)))  # fmt: skip

    cfg, pool = draw_pilot_commit(draw, history)
    return cfg, pool, draw(st.integers(0, 10_000)), draw(st.integers(1, 10))


@SETTINGS
@given(history_setups())
def test_every_invariant_holds_with_the_history_options(setup) -> None:
    cfg, pool, seed, steps = setup
    trace = ListTrace()
    strategy = build_strategy(cfg, pool, seed, generation_ranks=1, trace=trace)
    results = run_steps(strategy, BernoulliPolicy(spread_rates(pool, seed), seed), steps)
    assert check_trace(trace.events, cfg) == []
    counts = strategy.pool.counts()
    assert sum(counts.values()) == pool
    assert [strategy.pool.state(i) for i in range(pool)].count("evicted") == counts["evicted"]
    events = trace.events
    assert_step_accounting(results, events, cfg)


@SETTINGS
@given(history_setups(), st.integers(1, 6))
def test_resuming_mid_epoch_gives_the_identical_future(setup, more: int) -> None:
    cfg, pool, seed, steps = setup
    rates = spread_rates(pool, seed)
    trace_a = ListTrace()
    a = build_strategy(cfg, pool, seed, trace=trace_a)
    run_steps(a, BernoulliPolicy(rates, seed), steps)
    state = json.loads(json.dumps(a.state_dict()))  # through JSON, as a checkpoint stores it
    trace_b = ListTrace()
    b = build_strategy(cfg, pool, seed + 999, trace=trace_b)  # another seed: everything must come from the state
    b.load_state_dict(state)
    mark = len(trace_a.events)
    future_a = run_steps(a, BernoulliPolicy(rates, seed), more)
    future_b = run_steps(b, BernoulliPolicy(rates, seed), more)
    assert [r.metrics for r in future_a] == [r.metrics for r in future_b]
    assert trace_a.events[mark:] == trace_b.events
    assert json.dumps(a.state_dict()) == json.dumps(b.state_dict())
