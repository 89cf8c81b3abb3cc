"""Property tests of the allocation invariants (the foundation issue's acceptance list)."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_pc.allocation import build_strategy
from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.config import AllocationConfig, BufferConfig, PilotConfig
from megatron_pc.allocation.trace import ListTrace
from megatron_pc.errors import RoundLimitError

from allocation_helpers import BernoulliPolicy, run_steps, spread_rates

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def pilot_commit_setups(draw: st.DrawFn) -> tuple[AllocationConfig, int, int, int]:
    """A valid Pilot-Commit config, pool size, seed and step count."""
    train_batch = draw(st.integers(2, 12))
    pilot_n = draw(st.integers(2, 8))
    kept = draw(st.integers(1, pilot_n))
    commit_n = draw(st.integers(1, 8))
    p_lower = draw(st.sampled_from([0.0, 0.125, 0.25]))
    p_upper = draw(st.sampled_from([0.5, 0.75, 1.0]))
    cfg = AllocationConfig(
        strategy="pilot_commit",
        train_batch=train_batch,
        n=kept + commit_n,
        pilot=PilotConfig(n=pilot_n, n_effective=kept, batch=draw(st.integers(train_batch, 3 * train_batch)), keep=draw(st.sampled_from(["max_variance", "first"]))),
        p_lower=p_lower,
        p_upper=p_upper,
        p_evict=draw(st.sampled_from([0.75, 1.0])),
        buffer=BufferConfig(
            max_age=draw(st.integers(0, 4)),
            sampling=draw(st.sampled_from(["max_variance", "random"])),
            age_rule=draw(st.sampled_from(["strict", "reference"])),
        ),
        max_rounds=10,
        on_round_limit="train_partial",
    )
    pool = draw(st.integers(max(60, 3 * train_batch), 12 * train_batch + 60))
    return cfg, pool, draw(st.integers(0, 10_000)), draw(st.integers(1, 8))


def _run(cfg: AllocationConfig, pool: int, seed: int, steps: int):
    trace = ListTrace()
    strategy = build_strategy(cfg, pool, seed, trace=trace)
    results = run_steps(strategy, BernoulliPolicy(spread_rates(pool, seed), seed), steps)
    return strategy, results, trace.events


@SETTINGS
@given(pilot_commit_setups())
def test_every_prompt_is_in_exactly_one_state(setup) -> None:
    cfg, pool, seed, steps = setup
    strategy, _, _ = _run(cfg, pool, seed, steps)
    states = [strategy.pool.state(i) for i in range(pool)]
    counts = strategy.pool.counts()
    assert sum(counts.values()) == pool
    for name, count in counts.items():
        assert states.count(name) == count


@SETTINGS
@given(pilot_commit_setups())
def test_generated_equals_pilot_plus_commit_and_every_rollout_is_counted(setup) -> None:
    cfg, pool, seed, steps = setup
    _, results, events = _run(cfg, pool, seed, steps)
    for r in results:
        assert r.metrics["generated"] == r.metrics["generated_pilot"] + r.metrics["generated_commit"] + r.metrics["generated_full"]
        assert r.metrics["generated_full"] == 0
    pilot_rollouts = sum(e["n"] for e in events if e["event"] == "pilot")
    commit_rollouts = sum(e["n"] for e in events if e["event"] == "commit")
    assert results[-1].metrics["cum_generated_pilot"] == pilot_rollouts
    assert results[-1].metrics["cum_generated_commit"] == commit_rollouts
    piloted = [e for e in events if e["event"] == "pilot"]
    assert results[-1].metrics["cum_prompts_piloted"] == len(piloted)


@SETTINGS
@given(pilot_commit_setups())
def test_every_training_group_is_kept_pilots_plus_commits_of_one_prompt(setup) -> None:
    cfg, pool, seed, steps = setup
    _, results, _ = _run(cfg, pool, seed, steps)
    for r in results:
        for g in r.groups:
            assert g.size == cfg.pilot_kept + cfg.commit_rollouts == cfg.n
            assert g.n_pilot == cfg.pilot_kept
            assert {ro.data["prompt"] for ro in g.rollouts} == {g.prompt}


@SETTINGS
@given(pilot_commit_setups())
def test_no_prompt_is_evicted_unless_its_pilot_reached_the_threshold_and_it_is_never_drawn_again(setup) -> None:
    cfg, pool, seed, steps = setup
    strategy, _, events = _run(cfg, pool, seed, steps)
    evict_at: dict[int, int] = {}
    for i, e in enumerate(events):
        if e["event"] == "pilot":
            assert e["prompt"] not in evict_at, "an evicted prompt was piloted again"
            if e["evict"]:
                assert e["successes"] / e["n"] >= cfg.p_evict
                evict_at[e["prompt"]] = i
            else:
                assert e["successes"] / e["n"] < cfg.p_evict
    evicted = {i for i in range(pool) if strategy.pool.state(i) == "evicted"}
    assert evicted == set(evict_at)


@SETTINGS
@given(pilot_commit_setups())
def test_no_committed_pilot_is_older_than_the_age_limit(setup) -> None:
    cfg, pool, seed, steps = setup
    _, results, events = _run(cfg, pool, seed, steps)
    for e in events:
        if e["event"] == "commit":
            assert 0 <= e["step"] - e["pilot_step"] <= cfg.max_commit_age
    for r in results:
        assert r.metrics["offpolicy_age_max"] <= cfg.max_commit_age


@SETTINGS
@given(pilot_commit_setups())
def test_a_commit_always_follows_a_kept_pilot_of_the_same_prompt_in_an_earlier_round(setup) -> None:
    cfg, pool, seed, steps = setup
    _, _, events = _run(cfg, pool, seed, steps)
    kept_at: dict[int, tuple[int, int]] = {}
    for e in events:
        if e["event"] == "pilot" and e["decision"] == "keep":
            kept_at[e["prompt"]] = (e["step"], e["round"])
            assert cfg.p_lower <= e["successes"] / e["n"] <= cfg.p_upper
        if e["event"] == "commit":
            assert e["prompt"] in kept_at
            assert kept_at[e["prompt"]] < (e["step"], e["round"])
            assert kept_at[e["prompt"]][0] == e["pilot_step"]
            del kept_at[e["prompt"]]  # committed once per pilot


@SETTINGS
@given(
    st.integers(2, 10),
    st.integers(2, 8),
    st.integers(10, 120),
    st.integers(0, 1000),
    st.integers(1, 6),
)
def test_dapo_never_trains_on_a_zero_variance_group(train_batch: int, n: int, extra: int, seed: int, steps: int) -> None:
    pool = train_batch + extra
    cfg = AllocationConfig(strategy="dapo", train_batch=train_batch, n=n, max_rounds=50, on_round_limit="train_partial")
    trace = ListTrace()
    strategy = build_strategy(cfg, pool, seed, trace=trace)
    results = run_steps(strategy, BernoulliPolicy(spread_rates(pool, seed), seed), steps)
    for r in results:
        for g in r.groups:
            assert 0 < g.successes < g.size
    for e in trace.events:
        if e["event"] == "train_group":
            assert 0 < e["successes"] < e["size"]
        if e["event"] == "full" and e["successes"] in (0, e["n"]):
            assert not e["kept"]


@SETTINGS
@given(st.integers(1, 16), st.integers(1, 16), st.integers(0, 200), st.integers(0, 1000), st.integers(1, 6))
def test_grpo_trains_on_exactly_train_batch_times_n_rollouts_per_step(train_batch: int, n: int, extra: int, seed: int, steps: int) -> None:
    pool = train_batch + extra
    cfg = AllocationConfig(strategy="grpo", train_batch=train_batch, n=n)
    strategy = build_strategy(cfg, pool, seed)
    results = run_steps(strategy, BernoulliPolicy(spread_rates(pool, seed), seed), steps)
    for r in results:
        assert r.metrics["trained_rollouts"] == r.metrics["generated"] == train_batch * n
        assert len({g.prompt for g in r.groups}) == train_batch
        assert r.metrics["rounds"] == 1


ALL_STRATEGIES = ["pilot_commit", "grpo", "dapo", "speed_rl", "greso", "mopps"]


def fit_field_allocator(cfg: AllocationConfig) -> None:
    """Settings of the field's allocators that fit a drawn Pilot-Commit setup: SPEED-RL screens
    with Pilot-Commit's pilot size where the group leaves room, GRESO rolls out a train batch a round."""
    cfg.speed_rl.n_init = max(1, min(cfg.pilot.n, cfg.n - 1))
    cfg.greso.batch = cfg.train_batch


@SETTINGS
@given(pilot_commit_setups(), st.integers(1, 6), st.sampled_from(ALL_STRATEGIES))
def test_save_and_restore_mid_run_gives_identical_future_traces(setup, more_steps: int, strategy_name: str) -> None:
    cfg, pool, seed, steps = setup
    cfg.strategy = strategy_name
    fit_field_allocator(cfg)
    policy = BernoulliPolicy(spread_rates(pool, seed), seed)
    trace_a = ListTrace()
    a = build_strategy(cfg, pool, seed, trace=trace_a)
    run_steps(a, policy, steps)
    # A checkpoint in the middle of a step (between rounds) too, when the step has rounds left.
    if not a.batch_ready():
        plan = a.plan_round()
        a.observe(plan, policy.generate(plan))
    state = json.loads(json.dumps(a.state_dict()))
    mark = len(trace_a.events)
    trace_b = ListTrace()
    b = build_strategy(cfg, pool, seed + 999, trace=trace_b)  # a different seed: state must win
    b.load_state_dict(state)
    run_steps(a, policy, more_steps)
    run_steps(b, policy, more_steps)
    assert trace_b.events == trace_a.events[mark:]
    assert json.dumps(a.state_dict()) == json.dumps(b.state_dict())


@st.composite
def small_pool_setups(draw: st.DrawFn) -> tuple[AllocationConfig, int, int, int]:
    """Any strategy on a pool of only 1-3 train batches, run for many epochs: every step is
    likely to cross an epoch boundary somewhere."""
    cfg, _, seed, _ = draw(pilot_commit_setups())
    cfg.strategy = draw(st.sampled_from(ALL_STRATEGIES))
    fit_field_allocator(cfg)
    cfg.max_rounds = 30
    pool = draw(st.integers(cfg.train_batch, 3 * cfg.train_batch + 2))
    if cfg.strategy in ("pilot_commit", "speed_rl"):
        pool = max(pool, cfg.pilot.batch)
    return cfg, pool, seed, draw(st.integers(10, 40))


@SETTINGS
@given(small_pool_setups())
def test_no_train_batch_holds_a_prompt_twice_across_epoch_boundaries(setup) -> None:
    cfg, pool, seed, steps = setup
    trace = ListTrace()
    strategy = build_strategy(cfg, pool, seed, trace=trace)
    policy = BernoulliPolicy(spread_rates(pool, seed), seed)
    results = []
    for _ in range(steps):
        try:
            results += run_steps(strategy, policy, 1)
        except RoundLimitError as err:  # a tiny pool can be evicted whole: then the run ends
            assert "evicted" in str(err) or "left in the pool" in str(err)
            break
    events = trace.events
    for r in results:
        prompts = [g.prompt for g in r.groups]
        assert len(prompts) == len(set(prompts)), f"step {r.step} trains {sorted(p for p in prompts if prompts.count(p) > 1)} twice"
    assert not [p for p in check_trace(events, cfg) if "twice" in p]
    assert check_trace(events, cfg) == []


def test_round_limit_error_says_the_data_are_too_hard_for_the_band() -> None:
    cfg = AllocationConfig(strategy="pilot_commit", train_batch=4, n=8, pilot=PilotConfig(n=4, batch=4), max_rounds=3)
    strategy = build_strategy(cfg, 50, 0)
    policy = BernoulliPolicy([0.0] * 50)  # nothing is ever solved: every pilot is too hard
    try:
        run_steps(strategy, policy, 1)
    except RoundLimitError as err:
        message = str(err)
    else:
        raise AssertionError("expected RoundLimitError")
    assert "0/4 groups after 3 generation rounds" in message
    assert "allocation.on_round_limit=train_partial" in message
    assert "too hard" in message


def test_train_partial_trains_on_the_short_batch_and_reports_it() -> None:
    cfg = AllocationConfig(
        strategy="pilot_commit", train_batch=8, n=8, pilot=PilotConfig(n=4, batch=4), max_rounds=3, on_round_limit="train_partial"
    )
    strategy = build_strategy(cfg, 200, 0)
    rates = [0.5 if i % 4 == 0 else 0.0 for i in range(200)]
    (result,) = run_steps(strategy, BernoulliPolicy(rates), 1)
    assert 0 < len(result.groups) < 8
    assert result.partial and result.metrics["partial_steps"] == 1
