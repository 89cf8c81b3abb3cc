"""Priors from record metadata (allocation.history.metadata, preset metadata): the buckets, the
hierarchical prior, screening by it, the coverage guard, invariants and an exact resume."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_pc.allocation import AllocationStrategy, RoundPlan, build_strategy
from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.config import AllocationConfig, HistoryConfig, PilotConfig
from megatron_pc.allocation.history import beta_by_moments
from megatron_pc.allocation.metadata_prior import MetadataPrior, bucket_keys, index_buckets
from megatron_pc.allocation.pilot_commit import _keepable, short_pilot
from megatron_pc.allocation.trace import ListTrace
from megatron_pc.data.records import record_from_row
from megatron_pc.errors import ConfigError

from allocation_helpers import BernoulliPolicy, assert_step_accounting, draw_pilot_commit, run_with_features

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Rec:
    difficulty: float | None = None
    source: str | None = None
    metadata: tuple = ()


# ---- buckets --------------------------------------------------------------------------------
def test_categorical_fields_give_a_bucket_per_value_and_a_missing_value_its_own() -> None:
    records = [Rec(3.0, "a"), Rec(5.0, "b"), Rec(None, "a"), Rec(3.0, None)]
    assert bucket_keys(records, ["difficulty"], bins=8) == ["difficulty=3", "difficulty=5", "difficulty=?", "difficulty=3"]
    assert bucket_keys(records, ["source", "difficulty"], bins=8) == [
        "source=a;difficulty=3", "source=b;difficulty=5", "source=a;difficulty=?", "source=?;difficulty=3"]  # fmt: skip


def test_a_numeric_field_with_many_values_is_cut_into_equal_count_bins() -> None:
    records = [Rec(float(v)) for v in range(100)]
    keys = bucket_keys(records, ["difficulty"], bins=4)
    counts = Counter(keys)
    assert len(counts) == 4 and set(counts.values()) == {25}
    assert keys[0] == "difficulty=[0,25)" and keys[-1] == "difficulty=[75,99]"
    # Fewer distinct values than bins: categories, however numeric.
    assert len(set(bucket_keys([Rec(float(v % 3)) for v in range(100)], ["difficulty"], bins=4))) == 3


def test_fields_of_extra_info_and_other_columns_are_kept_and_named() -> None:
    row = {"id": "x", "prompt": "1+1=", "answer": "2", "topic": "algebra", "solution": "x" * 201, "extra_info": {"level": 4, "tags": ["a"]}}
    record = record_from_row(row, "f.jsonl:1")
    assert dict(record.metadata) == {"topic": "algebra", "extra_info.level": 4}  # a list, and a long text, are not labels
    assert bucket_keys([record], ["topic", "extra_info.level"], bins=8) == ["topic=algebra;extra_info.level=4"]
    assert record_from_row(record.to_row(), "round trip") == record


def test_a_field_no_prompt_carries_is_refused_by_name() -> None:
    with pytest.raises(ConfigError, match=r"allocation\.history\.metadata.*'grade'"):
        bucket_keys([Rec(1.0), Rec(2.0)], ["grade"], bins=8)


def test_noise_shuffles_that_share_of_the_labels_among_themselves() -> None:
    records = [Rec(float(i % 5)) for i in range(1000)]
    clean = bucket_keys(records, ["difficulty"], bins=8)
    noisy = bucket_keys(records, ["difficulty"], bins=8, noise=0.2, seed=3)
    assert Counter(noisy) == Counter(clean)  # the same labels, some on other prompts
    changed = sum(a != b for a, b in zip(clean, noisy))
    assert 100 < changed <= 200  # of the 200 shuffled, those that landed on their own label stay
    assert noisy == bucket_keys(records, ["difficulty"], bins=8, noise=0.2, seed=3)


# ---- the hierarchical prior ------------------------------------------------------------------
def test_a_bucket_prior_moves_from_the_population_to_its_own_outcomes() -> None:
    meta = MetadataPrior(*index_buckets(["hard"] * 50 + ["band"] * 50), half_life=1e9, shrink=8.0)
    population = (100.0, 40.0, 30.0)  # weight, sum of p, sum of p^2: mean 0.4
    unseen = meta.prior(0, 1, population)
    assert unseen == beta_by_moments(0.4, 0.3, max_strength=8.0)  # nothing seen: the population, as strong as the shrink
    means = []
    for k in range(40):
        meta.observe(k, 0, 16, 1)  # every pilot of the hard bucket: 0 of 16
        a, b = meta.prior(0, 1, population)
        means.append(a / (a + b))
    assert all(x > y for x, y in zip(means, means[1:])) and means[-1] < 0.1
    a, b = meta.prior(60, 1, population)
    assert a / (a + b) == pytest.approx(0.4, abs=1e-3)  # the other bucket is still the population
    assert not meta.calibrated(60, 1) and meta.calibrated(0, 1)


def test_recent_outcomes_weigh_more_and_the_guard_resets_each_epoch() -> None:
    meta = MetadataPrior(*index_buckets(["a"] * 10), half_life=2.0, shrink=1.0, min_judged=3)
    assert meta.owed(0)
    for k in range(20):
        meta.observe(k % 10, 0, 8, 1)
    assert meta.weight(0, 1) == 20.0 and meta.weight(0, 5) == pytest.approx(5.0)
    assert meta.calibrated(0, 1) and not meta.calibrated(0, 5)
    assert not meta.owed(0)
    meta.end_epoch()
    assert meta.owed(0)  # judged none of this epoch yet
    for k in range(3):
        meta.observe(k, 1, 8, 1)
    assert not meta.owed(0)


def test_the_state_round_trips_and_other_buckets_are_refused() -> None:
    meta = MetadataPrior(*index_buckets(["a", "b", "a"]), half_life=20.0, shrink=8.0, min_judged=2)
    meta.observe(0, 3, 16, 4)
    meta.observe(1, 9, 16, 6)
    state = json.loads(json.dumps(meta.state_dict()))
    again = MetadataPrior(*index_buckets(["a", "b", "a"]), half_life=20.0, shrink=8.0, min_judged=2)
    again.load_state_dict(state)
    pop = (40.0, 12.0, 6.0)
    assert [again.prior(p, 9, pop) for p in range(3)] == [meta.prior(p, 9, pop) for p in range(3)]
    with pytest.raises(ValueError, match="metadata buckets"):
        MetadataPrior(*index_buckets(["a", "c", "a"]), half_life=20.0, shrink=8.0).load_state_dict(state)


# ---- settings ---------------------------------------------------------------------------------
def test_the_metadata_preset_turns_the_screen_on_and_needs_fields() -> None:
    h = HistoryConfig(preset="metadata", metadata=["difficulty"])
    assert h.screen and h.predictor and h.direct_commit and h.demand_pilots and h.posterior_evict and h.active
    with pytest.raises(ConfigError, match="metadata"):
        HistoryConfig(preset="metadata")


@pytest.mark.parametrize(("field", "value"), [("metadata_bins", 1), ("metadata_shrink", 0.0), ("metadata_noise", 1.5),
                                              ("metadata_min_judged", -1), ("metadata", ["a", "a"]), ("metadata", [""])])  # fmt: skip
def test_bad_metadata_settings_are_refused_by_name(field: str, value: object) -> None:
    with pytest.raises(ConfigError, match=field):
        HistoryConfig(**{field: value})


def test_a_strategy_given_no_metadata_refuses_to_plan_and_to_resume() -> None:
    cfg = _cfg(preset="metadata", metadata=["difficulty"])
    with pytest.raises(ConfigError, match=r"allocation\.history\.metadata"):
        build_strategy(cfg, 300, 0).plan_round()
    state = _strategy(cfg, ["x"] * 300, 0).state_dict()
    with pytest.raises(ValueError, match="no record metadata"):
        build_strategy(cfg, 300, 0).load_state_dict(state)
    plain = build_strategy(_cfg(preset="screen"), 300, 0).state_dict()
    with pytest.raises(ValueError, match="no metadata priors"):
        _strategy(cfg, ["x"] * 300, 0).load_state_dict(plain)


# ---- behaviour -------------------------------------------------------------------------------
class NoiseFeatures:
    """Features that say nothing about a prompt (so the n-gram side of the preset cannot help)."""

    def __init__(self, size: int, seed: int, dim: int = 6) -> None:
        self.table = np.random.default_rng(seed).normal(0.0, 1.0, (size, dim))

    def __call__(self, prompts):
        return {p: self.table[p] for p in prompts}


def _cfg(**history: object) -> AllocationConfig:
    return AllocationConfig(strategy="pilot_commit", train_batch=8, n=16, pilot=PilotConfig(n=4, batch=24), history=HistoryConfig(**history),
                            max_rounds=10, on_round_limit="train_partial")  # fmt: skip


def _strategy(cfg: AllocationConfig, keys: list[str], seed: int, trace: ListTrace | None = None) -> AllocationStrategy:
    strategy = build_strategy(cfg, len(keys), seed, trace=trace)
    strategy.set_prompt_metadata(keys)
    return strategy


_run = run_with_features


def test_a_bucket_prior_screens_hopeless_prompts_never_seen_where_ngrams_cannot() -> None:
    rates = [0.0, 1.0, 0.5] * 1000  # 3,000 prompts: 30 steps stay in the first epoch
    keys = ["d=9", "d=1", "d=5"] * 1000
    cfg = _cfg(preset="metadata", metadata=["difficulty"], explore=0.05)
    trace = ListTrace()
    strategy = _strategy(cfg, keys, 1, trace)
    results = _run(strategy, BernoulliPolicy(rates, 1), NoiseFeatures(len(rates), 1), 30)
    assert check_trace(trace.events, cfg) == []
    assert strategy.pool.epoch == 0
    screened = [e for e in trace.events if e["event"] == "screen"]
    assert len(screened) > 100 and all(e["evidence"] == 0 and e["prior_source"] == "metadata" for e in screened)
    assert all(rates[e["prompt"]] != 0.5 for e in screened)
    # The same run with the same uninformative features and no metadata (pc_screen) screens nothing.
    plain_trace = ListTrace()
    plain = build_strategy(_cfg(preset="screen", explore=0.05), len(rates), 1, trace=plain_trace)
    plain_results = _run(plain, BernoulliPolicy(rates, 1), NoiseFeatures(len(rates), 1), 30)
    per_group = lambda r: r[-1].metrics["cum_generated"] / r[-1].metrics["cum_trained_groups"]  # noqa: E731
    assert per_group(results) < 0.8 * per_group(plain_results)
    pilots = lambda r: r[-1].metrics["cum_generated_pilot"] / r[-1].metrics["cum_generated"]  # noqa: E731
    assert pilots(results) < pilots(plain_results)
    # The bucket priors' keep chances are calibrated better than the population's.
    scored = [r.metrics for r in results[5:] if r.metrics["screen_brier"] is not None]
    assert scored and sum(m["screen_brier"] for m in scored) < sum(m["screen_brier_population"] for m in scored)
    assert results[-1].metrics["bucket_coverage"] == pytest.approx(1 / 3)  # only d=5 has groups to train
    assert results[-1].metrics["cum_prompts_bucket_prior"] > 0


class LearningPolicy(BernoulliPolicy):
    """The policy learns the ``late`` prompts at step ``at``: they go from never solved to half."""

    def __init__(self, rates: list[float], late: set[int], at: int, seed: int) -> None:
        super().__init__(list(rates), seed)
        self.base, self.late, self.at = list(rates), late, at

    def generate(self, plan: RoundPlan):
        self.rates = [0.5 if (p in self.late and plan.step >= self.at) else r for p, r in enumerate(self.base)]
        return super().generate(plan)


def _coverage_run(min_judged: int, explore: float) -> tuple[list[dict], list[int]]:
    size = 240
    keys = ["band", "late", "never"] * (size // 3)
    rates = [0.5 if k == "band" else 0.0 for k in keys]
    policy = LearningPolicy(rates, {i for i, k in enumerate(keys) if k == "late"}, at=25, seed=7)
    cfg = _cfg(preset="metadata", metadata=["topic"], explore=explore, metadata_min_judged=min_judged, recency_half_life=50.0, half_life=50.0)
    trace = ListTrace()
    strategy = _strategy(cfg, keys, 7, trace)
    _run(strategy, policy, NoiseFeatures(size, 7), 70)
    assert check_trace(trace.events, cfg) == []
    late = strategy.bucket_names.index("late")
    trained_late = [e["step"] for e in trace.events if e["event"] == "train_group" and strategy.buckets[e["prompt"]] == late]
    return [e for e in trace.events if e["event"] == "epoch_end"], trained_late


def test_no_bucket_is_starved_after_the_policy_learns_it() -> None:
    # "late" looks hopeless for 24 steps; then the policy solves it half the time. The coverage guard
    # pilots every bucket again each epoch, so it is found and trained in every epoch after that.
    epochs, trained_late = _coverage_run(min_judged=4, explore=0.0)
    after = [e for e in epochs if e["step"] > 30]
    assert len(after) >= 2
    assert all(e["bucket_coverage"] == pytest.approx(2 / 3) for e in after)  # band and late; never has nothing to train
    first_epoch_after = min(e["step"] for e in epochs if e["step"] >= 25)
    assert trained_late and 25 <= min(trained_late) <= first_epoch_after + 1  # found in the first epoch that starts after it
    # Without the guard (and without exploration) the bucket prior, sure of "hopeless", starves it for
    # a whole epoch or more: this is what the test exists to catch.
    starved_epochs, starved_late = _coverage_run(min_judged=0, explore=0.0)
    assert any(e["bucket_coverage"] < 2 / 3 for e in starved_epochs if e["step"] > 30)
    assert min(starved_late) > min(trained_late) + 5


# ---- invariants and resume ---------------------------------------------------------------------
@st.composite
def metadata_setups(draw: st.DrawFn) -> tuple[AllocationConfig, int, int, int, int]:
    def history(draw: st.DrawFn) -> HistoryConfig:
        return HistoryConfig(
            preset="metadata", metadata=["difficulty"], explore=draw(st.sampled_from([0.0, 0.05, 0.5])),
            half_life=draw(st.sampled_from([2.0, 50.0])), recency_half_life=draw(st.sampled_from([1.0, 20.0])),
            metadata_shrink=draw(st.sampled_from([0.5, 8.0])), metadata_min_judged=draw(st.sampled_from([0, 2, 8])),
            sized=draw(st.booleans()), large_factor=draw(st.sampled_from([2, 3])),
            min_fit=draw(st.sampled_from([0.0, 32.0])), pilot_floor=draw(st.integers(1, 8)),
            **{o: draw(st.booleans()) for o in ("demand_pilots", "direct_commit", "posterior_evict")},
        )  # fmt: skip

    cfg, pool = draw_pilot_commit(draw, history)
    if cfg.history.sized:  # a short pilot of any size the drawn band can keep, or none
        cfg.history.short_pilot = draw(st.sampled_from([0] + [m for m in range(1, min(cfg.pilot.n, cfg.n)) if _keepable(cfg, m)]))
    return cfg, pool, draw(st.integers(0, 10_000)), draw(st.integers(1, 12)), draw(st.integers(1, 5))


def _bucketed(pool: int, seed: int, buckets: int) -> tuple[list[float], list[str]]:
    rng = np.random.default_rng(seed)
    centre = rng.uniform(0.0, 1.0, buckets)
    which = rng.integers(0, buckets, pool)
    rates = np.clip(centre[which] + rng.normal(0.0, 0.15, pool), 0.0, 1.0)
    return [float(r) for r in rates], [f"difficulty={b}" for b in which]


@SETTINGS
@given(metadata_setups())
def test_every_invariant_holds_with_metadata_priors(setup) -> None:
    cfg, pool, seed, steps, buckets = setup
    rates, keys = _bucketed(pool, seed, buckets)
    trace = ListTrace()
    strategy = _strategy(cfg, keys, seed, trace)
    results = _run(strategy, BernoulliPolicy(rates, seed), NoiseFeatures(pool, seed), steps)
    assert check_trace(trace.events, cfg) == []
    assert sum(strategy.pool.counts().values()) == pool
    assert_step_accounting(results, trace.events, cfg)
    for m in (r.metrics for r in results):
        assert 0.0 <= m["bucket_coverage"] <= 1.0
    assert all("prior_source" in e for e in trace.events if e["event"] in ("pilot", "direct", "screen"))


@SETTINGS
@given(metadata_setups(), st.integers(1, 6))
def test_resuming_mid_epoch_with_metadata_priors_gives_the_identical_future(setup, more: int) -> None:
    cfg, pool, seed, steps, buckets = setup
    rates, keys = _bucketed(pool, seed, buckets)
    source = NoiseFeatures(pool, seed)
    trace_a = ListTrace()
    a = _strategy(cfg, keys, seed, trace_a)
    _run(a, BernoulliPolicy(rates, seed), source, steps)
    state = json.loads(json.dumps(a.state_dict()))  # through JSON, as a checkpoint stores it
    trace_b = ListTrace()
    b = _strategy(cfg, keys, seed + 999, trace_b)  # another seed: everything must come from the state
    b.load_state_dict(state)
    mark = len(trace_a.events)
    future_a = _run(a, BernoulliPolicy(rates, seed), source, more)
    future_b = _run(b, BernoulliPolicy(rates, seed), source, more)
    assert [r.metrics for r in future_a] == [r.metrics for r in future_b]
    assert trace_a.events[mark:] == trace_b.events
    assert json.dumps(a.state_dict()) == json.dumps(b.state_dict())


# ---- sized counts ---------------------------------------------------------------------------------
def _sizer(**history: object):
    cfg = AllocationConfig(strategy="pilot_commit", train_batch=8, n=64, pilot=PilotConfig(n=16, batch=24),
                           history=HistoryConfig(preset="metadata", metadata=["d"], sized=True, **history))  # fmt: skip
    return _strategy(cfg, ["x"] * 100, 0)


@pytest.mark.parametrize(("a", "b", "fresh", "short", "chosen"), [
    (3.0, 97.0, 0.001, None, ("full", 128)),  # surely about 3%, fresh prompts poor (a hard pool): 64 more rollouts here beat 64 on a fresh one
    (3.0, 97.0, 0.0134, None, ("full", 64)),  # the same prompt when a fresh prompt is informative 86% of the time at n: they go there
    (50.0, 50.0, 0.001, None, ("full", 64)),  # surely about a half: n rollouts are informative; more add nothing; a pilot would waste its 16
    (0.05, 2.0, 0.001, None, ("pilot", 4)),   # most likely never solved, perhaps sometimes: 4 rollouts are the cheap way to find out
    (0.05, 2.0, 0.001, 0, ("pilot", 16)),     # the same without short pilots: the full pilot
    (0.05, 2.0, 0.001, 8, ("pilot", 8)),      # a short pilot of the size set
])  # fmt: skip
def test_sized_counts_choose_per_prompt_among_short_and_full_pilots_n_and_a_larger_group(
        a: float, b: float, fresh: float, short: int | None, chosen: tuple[str, int]) -> None:  # fmt: skip
    from megatron_pc.allocation.history import Posterior

    strategy = _sizer(short_pilot=short)
    post = Posterior(a, b, 0.0)
    cfg = strategy.cfg
    p_keep = post.p_keep(cfg.pilot.n, cfg.p_lower, cfg.p_upper)
    assert strategy._sized(post, p_keep, post.p_informative(cfg.n), fresh) == chosen


def test_a_fresh_prompts_value_is_its_best_first_spend() -> None:
    from megatron_pc.allocation.history import Posterior

    jeffreys = Posterior(0.5, 0.5, 0.0)
    direct = jeffreys.p_informative(64) / 64  # 0.86 / 64
    q = jeffreys.p_keep(4, 0.125, 0.75)  # 1 to 3 of 4 right: 0.45
    assert _sizer(short_pilot=0)._fresh_value(jeffreys) == pytest.approx(direct)
    assert _sizer()._fresh_value(jeffreys) == pytest.approx(max(direct, q / (4 + q * 60))) == pytest.approx(q / (4 + q * 60))


def test_short_pilots_are_refused_where_they_could_never_be_kept_or_split() -> None:
    def cfg(**kw: object) -> AllocationConfig:
        return AllocationConfig(strategy="pilot_commit", train_batch=8, n=64, pilot=PilotConfig(n=16, batch=24),
                                history=HistoryConfig(preset="history_aware", sized=True, **kw))  # fmt: skip

    with pytest.raises(ConfigError, match="short_pilot.*must be < pilot.n"):
        build_strategy(cfg(short_pilot=16), 100, 0)
    with pytest.raises(ConfigError, match="short_pilot.*keep band"):  # 0, 1, 2 or 3 of 3: none in [0.4, 0.6]
        build_strategy(AllocationConfig(strategy="pilot_commit", train_batch=8, n=64, p_lower=0.4, p_upper=0.6, pilot=PilotConfig(n=16, batch=24),
                                        history=HistoryConfig(preset="history_aware", sized=True, short_pilot=3)), 100, 0)  # fmt: skip
    with pytest.raises(ConfigError, match="short_pilot"):
        HistoryConfig(preset="history_aware", sized=True, short_pilot=-1)
    with pytest.raises(ConfigError, match="history.short_pilot.*multiple of the 8 generation engines"):
        build_strategy(cfg(), 100, 0, generation_ranks=8)
    build_strategy(cfg(short_pilot=8), 100, 0, generation_ranks=8)  # 16, 48, 8 and 56 all split over 8
    # The default is a quarter of pilot.n, or none where that many can never be kept (1 of 4 pilots at the reference band).
    assert short_pilot(cfg()) == 4 and short_pilot(cfg(short_pilot=0)) == 0
    tiny = AllocationConfig(strategy="pilot_commit", train_batch=8, n=16, pilot=PilotConfig(n=4, batch=24),
                            history=HistoryConfig(preset="history_aware", sized=True))  # fmt: skip
    assert short_pilot(tiny) == 0
    assert short_pilot(AllocationConfig(strategy="pilot_commit", train_batch=8, n=64, pilot=PilotConfig(n=16, batch=24))) == 0  # sized off


def test_sized_counts_need_direct_commit_and_a_larger_group() -> None:
    with pytest.raises(ConfigError, match="sized"):
        HistoryConfig(sized=True)
    with pytest.raises(ConfigError, match="large_factor"):
        HistoryConfig(preset="history_aware", sized=True, large_factor=1)


def test_sized_counts_put_more_of_a_hard_pools_rollouts_into_training() -> None:
    # A hard pool: 90% never solved, 10% solved 1% of the time; the label tells the two apart. A fresh
    # prompt is worth little, so the rare solvable ones get 2n rollouts (64 are all wrong half the time),
    # and short pilots of 4 find the solvable ones cheaper than 16.
    kinds = [(0.0, "d=9")] * 9 + [(0.01, "d=7")]
    kinds = kinds * 400
    rates, keys = [r for r, _ in kinds], [k for _, k in kinds]
    figures = {}
    for sized, short in ((False, None), (True, 0), (True, None)):
        cfg = AllocationConfig(strategy="pilot_commit", train_batch=8, n=64, pilot=PilotConfig(n=16, batch=24),
                               history=HistoryConfig(preset="metadata", metadata=["d"], sized=sized, short_pilot=short), max_rounds=10,
                               on_round_limit="train_partial")  # fmt: skip
        trace = ListTrace()
        strategy = _strategy(cfg, keys, 3, trace)
        results = _run(strategy, BernoulliPolicy(rates, 3), NoiseFeatures(len(rates), 3), 40)
        assert check_trace(trace.events, cfg) == []
        m = results[-1].metrics
        figures[sized, short] = (m["cum_trained_rollouts"] / m["cum_generated"], m["cum_prompts_direct_large"], m["cum_prompts_short_pilot"])
        assert {e["n"] for e in trace.events if e["event"] == "pilot"} <= {16, short_pilot(cfg)} - {0}
    (trained_off, large_off, short_off), (trained_long, large_long, short_long), (trained_on, large_on, short_on) = figures.values()
    assert large_off == 0 and large_long > 0 and large_on > 0
    assert short_off == short_long == 0 and short_on > 0
    assert trained_off < trained_long < trained_on


@pytest.mark.parametrize("name", ["grpo", "dapo", "speed_rl", "greso", "mopps", "pilot_commit"])
def test_every_strategy_reports_its_bucket_coverage_when_given_the_buckets(name: str) -> None:
    keys = ["a", "b", "c", "d"] * 30
    rates = [0.5, 0.5, 0.0, 1.0] * 30  # only a and b can be trained by a filter
    cfg = AllocationConfig(strategy=name, train_batch=4, n=8, pilot=PilotConfig(n=2, batch=12), dapo_batch=4, max_rounds=20,
                           on_round_limit="train_partial")  # fmt: skip
    trace = ListTrace()
    strategy = _strategy(cfg, keys, 5, trace)
    results = _run(strategy, BernoulliPolicy(rates, 5), None, 40)
    assert check_trace(trace.events, cfg) == []
    ends = [e for e in trace.events if e["event"] == "epoch_end"]
    # An epoch shorter than a step can end before any of its groups is trained (they count for the next).
    assert ends and all(0.0 <= e["bucket_coverage"] <= 1.0 for e in ends) and any(e["bucket_coverage"] > 0 for e in ends)
    trained = {keys[e["prompt"]] for e in trace.events if e["event"] == "train_group" and e["step"] <= ends[0]["step"]}
    assert all(r.metrics["buckets_trained"] <= 4 for r in results)
    if name == "grpo":  # GRPO trains whatever it draws: every bucket, every epoch
        assert all(e["bucket_coverage"] == 1.0 for e in ends)
    assert {"a", "b"} <= trained
