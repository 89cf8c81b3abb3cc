"""The screen (allocation.history.predictor, preset screen): the predictor, the features, the
calibration figures, and every allocation invariant with the screen on, resume included."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_pc.allocation import build_strategy
from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.config import AllocationConfig, HistoryConfig, PilotConfig
from megatron_pc.allocation.feature_sources import NgramFeatures, check_feature_source, ngram_vector
from megatron_pc.allocation.predictor import ScreenPredictor, auc, brier
from megatron_pc.allocation.trace import ListTrace
from megatron_pc.errors import ConfigError

from allocation_helpers import BernoulliPolicy, assert_step_accounting, draw_pilot_commit, run_with_features, spread_rates

SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])


class RateFeatures:
    """A feature source for the tests: a noisy view of each prompt's true rate, plus noise features."""

    def __init__(self, rates: list[float], seed: int, noise: float = 0.1, dim: int = 6) -> None:
        rng = np.random.default_rng(seed)
        self.table = rng.normal(0.0, 1.0, (len(rates), dim))
        self.table[:, 0] = np.asarray(rates) + rng.normal(0.0, noise, len(rates))
        self.calls: list[list[int]] = []

    def __call__(self, prompts):
        self.calls.append(list(prompts))
        return {p: self.table[p] for p in prompts}


run_screen = run_with_features


# ---- the predictor ----------------------------------------------------------------------
def _feed(pred: ScreenPredictor, x: np.ndarray, p: np.ndarray, step: int, rng: np.random.Generator, n: int = 16, first: int = 0) -> None:
    pred.add_features({first + i: x[i] for i in range(len(x))}, step)
    for i in range(len(x)):
        pred.observe(first + i, int(rng.binomial(n, p[i])), n, None)
    pred.flush(step)


def test_the_predictor_learns_a_known_linear_relation() -> None:
    rng = np.random.default_rng(0)
    beta = np.array([0.2, -0.15, 0.1, 0.0, 0.05])
    x = rng.normal(0.0, 1.0, (2000, 5))
    p = np.clip(0.5 + x @ beta, 0.02, 0.98)
    pred = ScreenPredictor(HistoryConfig(preset="screen", ridge_lambda=1.0, recency_half_life=1e9))
    _feed(pred, x, p, 1, rng)
    assert pred.prediction(0, 2) is not None
    test_x = rng.normal(0.0, 1.0, (300, 5))
    pred.add_features({10_000 + i: test_x[i] for i in range(300)}, 2)
    got = np.array([pred.prediction(10_000 + i, 2) for i in range(300)])
    truth = np.clip(0.5 + test_x @ beta, 0.02, 0.98)
    assert np.corrcoef(got, truth)[0, 1] > 0.97
    assert np.mean(np.abs(got - truth)) < 0.04


def test_the_predictor_is_deterministic_and_its_state_round_trips_through_json() -> None:
    def build() -> ScreenPredictor:
        rng = np.random.default_rng(3)
        pred = ScreenPredictor(HistoryConfig(preset="screen"))
        for step in range(1, 6):
            x = rng.normal(size=(40, 4))
            _feed(pred, x, 1 / (1 + np.exp(-x[:, 0])), step, rng, first=100 * step)
            pred.prediction(100 * step, step + 1)
        return pred

    a, b = build(), build()
    assert json.dumps(a.state_dict()) == json.dumps(b.state_dict())
    c = ScreenPredictor(HistoryConfig(preset="screen"))
    c.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert json.dumps(c.state_dict()) == json.dumps(a.state_dict())
    assert [c.prediction(p, 6) for p in range(500, 540)] == [a.prediction(p, 6) for p in range(500, 540)]
    assert [c.prior(p, 7) for p in range(500, 540)] == [a.prior(p, 7) for p in range(500, 540)]


def test_recent_outcomes_weigh_more() -> None:
    # For 20 steps prompts with a high first feature are solved; then the relation flips.
    def after_flip(half_life: float) -> float:
        rng = np.random.default_rng(1)
        pred = ScreenPredictor(HistoryConfig(preset="screen", recency_half_life=half_life, min_fit=1))
        for step in range(1, 31):
            x = rng.normal(size=(50, 3))
            sign = 1.0 if step <= 20 else -1.0
            _feed(pred, x, np.clip(0.5 + sign * 0.3 * x[:, 0], 0.0, 1.0), step, rng, first=100 * step)
        pred.add_features({1: np.array([1.0, 0.0, 0.0])}, 31)
        return pred.prediction(1, 31)

    # The new relation says 0.2 for the probe; the old one said 0.8.
    assert after_flip(3.0) < 0.3
    assert after_flip(3.0) < after_flip(1e9) - 0.2


def test_the_prior_strength_follows_how_much_the_features_tell() -> None:
    def strength(noise: float) -> float:
        rng = np.random.default_rng(2)
        pred = ScreenPredictor(HistoryConfig(preset="screen", recency_half_life=1e9))
        for step in range(1, 21):
            rates = np.where(rng.random(100) < 0.5, rng.random(100) * 0.1, 0.9 + rng.random(100) * 0.1)  # U-shaped pool
            x = np.stack([rates + rng.normal(0, noise, 100), rng.normal(size=100)], axis=1)
            pred.add_features({1000 * step + i: x[i] for i in range(100)}, step)
            for i in range(100):  # predictions made before the outcomes, as the strategy does
                pred.observe(1000 * step + i, int(rng.binomial(8, rates[i])), 8, pred.prediction(1000 * step + i, step))
            pred.flush(step)
        pred.fit(21)
        return pred.strength

    informative, useless = strength(0.02), strength(5.0)
    assert informative > 10 * useless
    assert useless < 2.0  # about the U-shaped pool's own a + b


def test_bad_features_are_refused() -> None:
    pred = ScreenPredictor(HistoryConfig(preset="screen"))
    pred.add_features({0: np.zeros(4)}, 1)
    with pytest.raises(ValueError, match="4 values"):
        pred.add_features({1: np.zeros(5)}, 1)
    with pytest.raises(ValueError, match="non-finite"):
        pred.add_features({2: np.array([0.0, math.nan, 0.0, 0.0])}, 1)


# ---- calibration figures ------------------------------------------------------------------
def test_auc_and_brier_match_their_definitions() -> None:
    rng = random.Random(0)
    for _ in range(20):
        score = [rng.choice([0.1, 0.2, 0.3, rng.random()]) for _ in range(30)]
        label = [rng.random() < s + 0.2 for s in score]
        pos = [s for s, y in zip(score, label) if y]
        neg = [s for s, y in zip(score, label) if not y]
        if pos and neg:
            brute = sum(1.0 if a > b else 0.5 if a == b else 0.0 for a in pos for b in neg) / (len(pos) * len(neg))
            assert auc(score, label) == pytest.approx(brute)
        assert brier(score, label) == pytest.approx(sum((s - y) ** 2 for s, y in zip(score, label)) / 30)
    assert math.isnan(auc([0.3, 0.4], [True, True])) and math.isnan(brier([], []))


# ---- features ----------------------------------------------------------------------------
def test_ngram_features_are_deterministic_unit_vectors_that_tell_texts_apart() -> None:
    a = ngram_vector("6745+2749=", 256, 3)
    assert a.shape == (256,) and np.linalg.norm(a) == pytest.approx(1.0)
    assert np.array_equal(a, ngram_vector("6745+2749=", 256, 3))
    near, far = ngram_vector("6745+2748=", 256, 3), ngram_vector("13*71=", 256, 3)
    assert a @ near > a @ far
    source = NgramFeatures(["1+1=", "22*3="], dim=64, max_n=2)
    assert set(source([1, 0])) == {0, 1} and source([1])[1].shape == (64,)
    assert np.linalg.norm(ngram_vector("", 32, 3)) == 0.0


# ---- config ---------------------------------------------------------------------------
def test_the_screen_preset_turns_the_history_options_and_the_predictor_on() -> None:
    h = HistoryConfig(preset="screen")
    assert h.predictor and h.screen and h.direct_commit and h.demand_pilots and h.posterior_evict
    assert not HistoryConfig(preset="history_aware").predictor and not HistoryConfig().predictor


@pytest.mark.parametrize("field,value", [("screen_relative", 1.5), ("ridge_lambda", 0.0), ("recency_half_life", -1.0), ("prior_strength", 0.0),
                                         ("min_fit", -1.0), ("lookahead", 0), ("ngram_dim", 0), ("feature_max_age", -1)])  # fmt: skip
def test_bad_screen_settings_are_refused_by_name(field: str, value: float) -> None:
    with pytest.raises(ConfigError, match=field):
        HistoryConfig(preset="screen", **{field: value})


def test_policy_features_are_refused_until_a_source_is_registered(monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron_pc.allocation import feature_sources as features

    class Cfg:
        allocation = AllocationConfig(history=HistoryConfig(preset="screen", features="policy"))

    monkeypatch.setattr(features, "FEATURE_SOURCES", {})  # as before megatron_pc.driver.screen registers it
    with pytest.raises(ConfigError, match="allocation.history.features"):
        check_feature_source(Cfg())
    features.register_feature_source("policy", lambda cfg, data, workers: lambda ids: {})
    check_feature_source(Cfg())
    Cfg.allocation = AllocationConfig(history=HistoryConfig(preset="screen"))
    check_feature_source(Cfg())  # ngrams: always there


# ---- behaviour ------------------------------------------------------------------------------
def _cfg(**history: object) -> AllocationConfig:
    return AllocationConfig(strategy="pilot_commit", train_batch=8, n=16, pilot=PilotConfig(n=4, batch=24), history=HistoryConfig(**history),
                            max_rounds=10, on_round_limit="train_partial")  # fmt: skip


def test_screening_by_prediction_spares_pilots_of_prompts_never_seen() -> None:
    rates = [0.0, 1.0, 0.5] * 1000  # 3,000 prompts: 30 steps stay in the first epoch
    cfg = _cfg(preset="screen", explore=0.05)
    trace = ListTrace()
    strategy = build_strategy(cfg, len(rates), 1, trace=trace)
    results = run_screen(strategy, BernoulliPolicy(rates, 1), RateFeatures(rates, 1), 30)
    assert check_trace(trace.events, cfg) == []
    assert strategy.pool.epoch == 0
    screened = [e for e in trace.events if e["event"] == "screen"]
    assert len(screened) > 100 and all(e["evidence"] == 0 and e["predicted_p"] is not None for e in screened)
    assert all(min(e["mean"] / e["population_mean"], (1 - e["mean"]) / (1 - e["population_mean"])) <= cfg.history.screen_relative for e in screened)
    assert sum(rates[e["prompt"]] != 0.5 for e in screened) >= 0.95 * len(screened)
    # pc_history cannot screen in a first epoch: it pilots the hopeless prompts it draws.
    history_trace = ListTrace()
    plain = build_strategy(_cfg(preset="history_aware"), len(rates), 1, trace=history_trace)
    plain_results = run_screen(plain, BernoulliPolicy(rates, 1), None, 30)
    assert not [e for e in history_trace.events if e["event"] == "screen"]
    per_group = lambda r: r[-1].metrics["cum_generated"] / r[-1].metrics["cum_trained_groups"]  # noqa: E731
    assert per_group(results) < per_group(plain_results)
    # Calibration: the predicted keep chances beat the population prior's on the prompts piloted.
    scored = [r.metrics for r in results[5:] if r.metrics["screen_brier"] is not None]
    assert scored and sum(m["screen_brier"] for m in scored) < sum(m["screen_brier_population"] for m in scored)
    for m in (r.metrics for r in results):
        assert m["share_screened"] + m["share_direct"] + m["share_piloted"] == pytest.approx(1.0) or m["prompts_drawn"] + m["prompts_screened"] == 0
    # The features asked for are the prompts drawn next, each once (n-grams never go stale).
    assert results[-1].metrics["cum_prompts_featureless"] == 0


def test_features_go_only_to_a_strategy_that_asks_for_them() -> None:
    plain = build_strategy(_cfg(preset="history_aware"), 300, 0)
    assert plain.feature_requests() == []
    with pytest.raises(RuntimeError, match="asked for no features"):
        plain.observe_features({0: np.zeros(3)}, 1)
    screen = build_strategy(_cfg(preset="screen", lookahead=10), 300, 0)
    wanted = screen.feature_requests()
    assert wanted == screen.pool.peek(10)
    screen.observe_features({p: np.zeros(3) for p in wanted}, 1)
    assert screen.feature_requests() == []


def test_a_checkpoint_without_the_predictor_is_refused_when_it_is_on() -> None:
    state = build_strategy(_cfg(preset="history_aware"), 300, 0).state_dict()
    with pytest.raises(ValueError, match="predictor"):
        build_strategy(_cfg(preset="screen"), 300, 0).load_state_dict(state)


def test_check_trace_catches_bad_screen_events() -> None:
    cfg = _cfg(preset="screen")
    base = {"event": "screen", "step": 1, "round": 1, "prompt": 3, "p_keep": 0.01, "mean": 0.01, "evidence": 0.0, "outcome": "too_hard"}
    assert check_trace([{**base, "predicted_p": 0.01, "population_mean": 0.3}], cfg) == []
    assert check_trace([{**base, "predicted_p": 0.01, "population_mean": 0.015}], cfg)  # not apart from the pool
    assert check_trace([{**base, "predicted_p": None, "population_mean": 0.3}], cfg)  # no evidence and no prediction
    assert check_trace([base], cfg)  # the predictor is on: every judged prompt carries its prediction
    assert check_trace([{**base, "predicted_p": 1.5, "population_mean": 0.3}], cfg)
    assert check_trace([{**base, "evidence": 5.0, "predicted_p": 0.01}], _cfg(preset="history_aware"))  # the predictor is off


# ---- invariants, with the screen on ------------------------------------------------------
@st.composite
def screen_setups(draw: st.DrawFn) -> tuple[AllocationConfig, int, int, int, float]:
    def history(draw: st.DrawFn) -> HistoryConfig:
        return HistoryConfig(
            preset="screen", explore=draw(st.sampled_from([0.0, 0.05, 0.5])), half_life=draw(st.sampled_from([2.0, 50.0])),
            recency_half_life=draw(st.sampled_from([1.0, 20.0])), min_fit=draw(st.sampled_from([0.0, 8.0, 32.0])),
            prior_strength=draw(st.sampled_from([None, 4.0])), lookahead=draw(st.sampled_from([None, 3, 50])),
            feature_max_age=draw(st.sampled_from([None, 0, 3])), pilot_floor=draw(st.integers(1, 8)),
            **{o: draw(st.booleans()) for o in ("demand_pilots", "direct_commit", "posterior_evict")},
        )  # fmt: skip

    cfg, pool = draw_pilot_commit(draw, history)
    return cfg, pool, draw(st.integers(0, 10_000)), draw(st.integers(1, 12)), draw(st.sampled_from([0.05, 0.3, 2.0]))


@SETTINGS
@given(screen_setups())
def test_every_invariant_holds_with_the_screen_on(setup) -> None:
    cfg, pool, seed, steps, noise = setup
    rates = spread_rates(pool, seed)
    trace = ListTrace()
    strategy = build_strategy(cfg, pool, seed, generation_ranks=1, trace=trace)
    results = run_screen(strategy, BernoulliPolicy(rates, seed), RateFeatures(rates, seed, noise), steps)
    assert check_trace(trace.events, cfg) == []
    counts = strategy.pool.counts()
    assert sum(counts.values()) == pool
    events = trace.events
    assert_step_accounting(results, events, cfg)
    for m in (r.metrics for r in results):
        for key in ("screen_brier", "screen_brier_population"):
            assert m[key] is None or 0.0 <= m[key] <= 1.0
        assert m["screen_auc"] is None or 0.0 <= m["screen_auc"] <= 1.0
    assert all("predicted_p" in e for e in events if e["event"] in ("pilot", "direct", "screen"))
    # The features kept are bounded: the look-ahead and the buffer, never the pool.
    assert len(strategy.predictor._features) <= strategy.lookahead + len(strategy.buffer)


@SETTINGS
@given(screen_setups(), st.integers(1, 6))
def test_resuming_mid_epoch_with_the_screen_gives_the_identical_future(setup, more: int) -> None:
    cfg, pool, seed, steps, noise = setup
    rates = spread_rates(pool, seed)
    source = RateFeatures(rates, seed, noise)
    trace_a = ListTrace()
    a = build_strategy(cfg, pool, seed, trace=trace_a)
    run_screen(a, BernoulliPolicy(rates, seed), source, steps)
    state = json.loads(json.dumps(a.state_dict()))  # through JSON, as a checkpoint stores it
    trace_b = ListTrace()
    b = build_strategy(cfg, pool, seed + 999, trace=trace_b)  # another seed: everything must come from the state
    b.load_state_dict(state)
    mark = len(trace_a.events)
    source.calls.clear()
    future_a = run_screen(a, BernoulliPolicy(rates, seed), source, more)
    calls_a, source.calls = source.calls, []
    future_b = run_screen(b, BernoulliPolicy(rates, seed), source, more)
    assert source.calls == calls_a  # the resumed run asks for the same features
    assert [r.metrics for r in future_a] == [r.metrics for r in future_b]
    assert trace_a.events[mark:] == trace_b.events
    assert json.dumps(a.state_dict()) == json.dumps(b.state_dict())


def test_wide_features_are_projected_and_still_predict() -> None:
    rng = np.random.default_rng(4)
    # A hidden state wider than max_features, of a modest effective rank as hidden states are.
    z = rng.normal(0.0, 1.0, (1500, 24))
    x = z @ rng.normal(0.0, 1.0, (24, 2000)) + 0.1 * rng.normal(0.0, 1.0, (1500, 2000))
    p = np.clip(0.5 + 0.3 * np.tanh(z[:, :4].sum(axis=1) / 2.0), 0.0, 1.0)
    pred = ScreenPredictor(HistoryConfig(preset="screen", max_features=256, recency_half_life=1e9))
    _feed(pred, x[:1200], p[:1200], 1, rng)
    assert next(iter(pred._features.values())).shape == (256,)
    pred.add_features({5000 + i: x[1200 + i] for i in range(300)}, 2)
    got = np.array([pred.prediction(5000 + i, 2) for i in range(300)])
    assert np.corrcoef(got, p[1200:])[0, 1] > 0.8


def test_a_pool_of_long_shots_is_not_screened_by_prediction_alone() -> None:
    # Every prompt is solved 3% of the time: each pilot is a long shot, and the predictions cannot
    # tell one prompt from another, so screening by prediction would only starve the batch.
    rates = [0.03] * 3000
    cfg = _cfg(preset="screen", explore=0.0)
    trace = ListTrace()
    strategy = build_strategy(cfg, len(rates), 2, trace=trace)
    run_screen(strategy, BernoulliPolicy(rates, 2), RateFeatures(rates, 2, noise=0.0), 15)
    assert check_trace(trace.events, cfg) == []
    assert sum(e["predicted_p"] is not None for e in trace.events if e["event"] == "pilot") > 100
    assert not [e for e in trace.events if e["event"] == "screen"]
