"""The field's other allocators (SPEED-RL, GRESO, MoPPS): their decisions, their accounting, and
the trace checker's hold on them."""

from __future__ import annotations

import copy

import pytest

from megatron_pc.allocation import build_strategy
from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.config import AllocationConfig, PilotConfig
from megatron_pc.allocation.greso import keep_probability
from megatron_pc.allocation.mopps import closest_to_target
from megatron_pc.allocation.speed_rl import speed_decision
from megatron_pc.allocation.trace import ListTrace
from megatron_pc.config import load_config
from megatron_pc.errors import ConfigError

from allocation_helpers import BernoulliPolicy, run_steps, spread_rates


def _run(strategy: str, steps: int, pool: int = 90, seed: int = 3, easy: float = 0.3, hard: float = 0.3, **settings: object):
    cfg = AllocationConfig(strategy=strategy, train_batch=6, n=8, pilot=PilotConfig(n=4, batch=12), max_rounds=20)
    for dotted, value in settings.items():
        section, name = dotted.split("__")
        setattr(getattr(cfg, section), name, value)
    trace = ListTrace()
    rates = spread_rates(pool, seed, easy=easy, hard=hard)
    results = run_steps(build_strategy(cfg, pool, seed, trace=trace), BernoulliPolicy(rates, seed), steps)
    return cfg, results, trace.events, rates


# ---- SPEED-RL ----------------------------------------------------------------------------------


def test_speed_accepts_a_screen_only_when_it_is_neither_all_right_nor_all_wrong() -> None:
    cfg = AllocationConfig(strategy="speed_rl")
    assert [speed_decision(cfg, s, 4) for s in range(5)] == ["too_hard", "keep", "keep", "keep", "too_easy"]


def test_speed_trains_screen_plus_continuation_of_accepted_prompts_only() -> None:
    cfg, results, events, rates = _run("speed_rl", 20)
    screens = {(e["step"], e["prompt"]): e for e in events if e["event"] == "pilot"}
    assert all(e["n"] == cfg.speed_rl.n_init for e in screens.values())
    for r in results:
        for g in r.groups:
            assert g.size == cfg.n and g.n_pilot == cfg.speed_rl.n_init
            assert screens[(g.pilot_step, g.prompt)]["decision"] == "keep"
            assert 0.0 < rates[g.prompt] < 1.0  # a prompt always or never solved cannot pass a screen
    continued = [e for e in events if e["event"] == "commit"]
    assert continued and all(e["n"] == cfg.n - cfg.speed_rl.n_init for e in continued)
    last = results[-1].metrics
    assert last["cum_generated"] == last["cum_generated_pilot"] + last["cum_generated_commit"]
    assert last["cum_prompts_evicted"] == 0 and check_trace(events, cfg) == []


def test_speed_screens_no_new_prompt_while_accepted_ones_can_fill_the_batch() -> None:
    _, _, events, _ = _run("speed_rl", 10, easy=0.0, hard=0.0)
    rounds: dict[tuple[int, int], list[dict]] = {}
    for e in events:
        if e["event"] in ("pilot", "commit"):
            rounds.setdefault((e["step"], e["round"]), []).append(e)
    # With every prompt of intermediate rate, one screening round fills the next rounds' continuations.
    assert any(all(e["event"] == "commit" for e in evs) for evs in rounds.values())


def test_speed_trace_checker_reports_a_wrong_screen_decision_and_an_eviction() -> None:
    cfg, _, events, _ = _run("speed_rl", 6)
    broken = copy.deepcopy(events)
    screen = next(e for e in broken if e["event"] == "pilot" and e["decision"] == "too_hard")
    screen["decision"] = "keep"
    assert any("expected too_hard" in p for p in check_trace(broken, cfg))
    evicted = copy.deepcopy(events)
    next(e for e in evicted if e["event"] == "pilot")["evict"] = True
    assert any("speed_rl evicts nothing" in p for p in check_trace(evicted, cfg))


def test_speed_refuses_a_screen_as_large_as_the_group() -> None:
    with pytest.raises(ConfigError, match="allocation.speed_rl.n_init"):
        load_config(None, ["allocation.strategy=speed_rl", "allocation.n=4"])


# ---- GRESO -------------------------------------------------------------------------------------


def test_greso_keep_probability_is_base_to_the_streak_with_a_floor() -> None:
    assert keep_probability(0.5, 0, 0.01) == 1.0
    assert keep_probability(0.5, 1, 0.01) == 0.5
    assert keep_probability(0.5, 3, 0.01) == 0.125
    assert keep_probability(0.5, 10, 0.01) == 0.01


def test_greso_never_judges_a_prompt_without_a_zero_variance_streak_and_skips_solved_ones_over_epochs() -> None:
    cfg, results, events, rates = _run("greso", 80, pool=60)
    judged = [e for e in events if e["event"] == "skip_check"]
    assert judged and all(e["streak"] >= 1 for e in judged)
    skipped = [e for e in judged if e["skipped"]]
    assert skipped
    # Prompts always solved or never solved are the ones skipped most.
    extreme = sum(1 for e in skipped if rates[e["prompt"]] in (0.0, 1.0))
    assert extreme / len(skipped) > 0.6
    last = results[-1].metrics
    assert last["cum_prompts_skipped"] == len(skipped) == last["cum_prompts_skipped_easy"] + last["cum_prompts_skipped_hard"]
    assert all(g.informative for r in results for g in r.groups)  # DAPO's dynamic sampling after the skip
    assert check_trace(events, cfg) == []


def test_greso_base_probabilities_move_by_the_step_towards_their_targets_from_the_second_epoch() -> None:
    cfg, results, _, _ = _run("greso", 60, pool=60, easy=0.4, hard=0.4)
    p_easy = [r.metrics["greso_p_easy"] for r in results]
    epochs = [r.metrics["epoch"] for r in results]
    first_epoch = [p for p, e in zip(p_easy, epochs) if e == 0]
    assert first_epoch and all(p == cfg.greso.p_easy for p in first_epoch[:-1])
    moves = {round(abs(a - b), 9) for a, b in zip(p_easy, p_easy[1:])}
    assert moves <= {0.0, cfg.greso.adjust_step} and cfg.greso.adjust_step in moves
    # Many all-correct groups: the easy base falls (skip more) towards its floor.
    assert min(p_easy) < cfg.greso.p_easy and all(cfg.greso.min_p <= p <= cfg.greso.max_p for p in p_easy)


def test_greso_trace_checker_reports_a_judgement_that_the_history_does_not_support() -> None:
    cfg, _, events, _ = _run("greso", 40, pool=60)
    broken = copy.deepcopy(events)
    check = next(e for e in broken if e["event"] == "skip_check")
    check["keep_probability"] = 0.99
    assert any("is not max(base^streak" in p for p in check_trace(broken, cfg))
    broken = copy.deepcopy(events)
    next(e for e in broken if e["event"] == "skip_check")["streak"] += 1
    assert any("the trace shows" in p for p in check_trace(broken, cfg))


# ---- MoPPS -------------------------------------------------------------------------------------


def test_mopps_chooses_the_samples_closest_to_the_target() -> None:
    samples = {1: 0.9, 2: 0.45, 3: 0.1, 4: 0.6, 5: 0.5}
    assert closest_to_target(samples, 0.5, 3) == [5, 2, 4]
    assert closest_to_target(samples, 0.0, 1) == [3]


def test_mopps_posterior_counts_successes_and_failures_with_its_decay() -> None:
    cfg = AllocationConfig(strategy="mopps", train_batch=2, n=4)
    cfg.mopps.decay = 0.5
    s = build_strategy(cfg, 40, 0)
    plan = s.plan_round()
    results = [[_rollout(k < 3) for k in range(4)] for _ in plan.requests]
    s.observe(plan, results)
    for req in plan.requests:
        # 0.5 x 1 + 0.5 x 1 + 3 successes; 0.5 x 1 + 0.5 x 1 + 1 failure
        assert s.posterior(req.prompt) == (4.0, 2.0)
    other = next(p for p in range(40) if p not in {r.prompt for r in plan.requests})
    assert s.posterior(other) == (1.0, 1.0)


def test_mopps_trains_every_chosen_group_and_avoids_prompts_it_learned_are_solved_or_hopeless() -> None:
    cfg, results, events, rates = _run("mopps", 60, pool=90, easy=0.35, hard=0.35)
    assert all(r.metrics["trained_rollouts"] == r.metrics["generated"] == cfg.train_batch * cfg.n for r in results)
    extreme = [sum(rates[g.prompt] in (0.0, 1.0) for g in r.groups) / len(r.groups) for r in results]
    # Uniform choice would give 0.7; once posteriors have evidence, they fall well below it.
    assert sum(extreme[-20:]) / 20 < 0.35
    assert results[-1].metrics["cum_prompts_passed"] > 0 and check_trace(events, cfg) == []


def test_mopps_trace_checker_reports_a_choice_that_is_not_the_closest() -> None:
    cfg, _, events, _ = _run("mopps", 4)
    broken = copy.deepcopy(events)
    select = next(e for e in broken if e["event"] == "select")
    unchosen = next(p for p, _ in select["candidates"] if p not in select["chosen"])
    select["chosen"] = select["chosen"][1:] + [unchosen]
    assert any("the samples closest to" in p for p in check_trace(broken, cfg))


def _rollout(correct: bool):
    from megatron_pc.allocation import Rollout

    return Rollout(float(correct), correct)
