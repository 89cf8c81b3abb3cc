"""The trace checker accepts real traces and names what is wrong in broken ones."""

from __future__ import annotations

import copy

import pytest

from megatron_pc.allocation import build_strategy
from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.config import AllocationConfig, BufferConfig, PilotConfig
from megatron_pc.allocation.trace import ListTrace

from allocation_helpers import BernoulliPolicy, run_steps, spread_rates


def _trace(strategy: str) -> tuple[AllocationConfig, list[dict]]:
    cfg = AllocationConfig(strategy=strategy, train_batch=6, n=8, pilot=PilotConfig(n=4, batch=12), max_rounds=20,
                           buffer=BufferConfig(age_rule="strict"))
    trace = ListTrace()
    run_steps(build_strategy(cfg, 90, 5, trace=trace), BernoulliPolicy(spread_rates(90, 5, easy=0.1, hard=0.1), 5), 12)
    return cfg, trace.events


@pytest.mark.parametrize("strategy", ["pilot_commit", "grpo", "dapo"])
def test_real_traces_pass(strategy: str) -> None:
    cfg, events = _trace(strategy)
    assert check_trace(events, cfg) == []


def test_a_commit_too_old_is_reported() -> None:
    cfg, events = _trace("pilot_commit")
    broken = copy.deepcopy(events)
    commit = next(e for e in broken if e["event"] == "commit")
    commit["step"] += cfg.buffer.max_age + 1
    assert any("steps after its pilot" in p for p in check_trace(broken, cfg))


def test_a_wrong_band_decision_is_reported() -> None:
    cfg, events = _trace("pilot_commit")
    broken = copy.deepcopy(events)
    pilot = next(e for e in broken if e["event"] == "pilot" and e["decision"] == "too_hard")
    pilot["decision"] = "keep"
    assert any("expected too_hard" in p for p in check_trace(broken, cfg))


def test_miscounted_generation_is_reported() -> None:
    cfg, events = _trace("grpo")
    broken = copy.deepcopy(events)
    next(e for e in broken if e["event"] == "step_end")["generated"]["full"] += 1
    assert any("events add up to" in p for p in check_trace(broken, cfg))


def test_redrawing_an_evicted_prompt_is_reported() -> None:
    cfg, events = _trace("pilot_commit")
    evict = next(e for e in events if e["event"] == "pilot" and e["evict"])
    broken = events + [dict(evict, evict=False, step=evict["step"] + 1)]
    assert any("drawn again" in p for p in check_trace(broken, cfg))


@pytest.mark.parametrize("strategy", ["pilot_commit", "grpo", "dapo"])
def test_a_prompt_twice_in_one_train_batch_is_reported(strategy: str) -> None:
    cfg, events = _trace(strategy)
    group = next(e for e in events if e["event"] == "train_group")
    at = events.index(group)
    broken = events[: at + 1] + [dict(group)] + events[at + 1 :]
    problems = check_trace(broken, cfg)
    assert any(f"prompt {group['prompt']} is in the train batch twice" in p for p in problems)


def test_the_reference_age_rule_allows_one_more_step_of_age_and_no_more() -> None:
    strict, events = _trace("pilot_commit")
    reference = copy.deepcopy(strict)
    reference.buffer.age_rule = "reference"
    commit = next(e for e in copy.deepcopy(events) if e["event"] == "commit")
    one_more = dict(commit, step=commit["pilot_step"] + strict.buffer.max_age + 1)
    # Only the commit's age matters here: check it alone, after its kept pilot.
    pilot = next(e for e in events if e["event"] == "pilot" and e["prompt"] == commit["prompt"] and e["decision"] == "keep")
    assert any("steps after its pilot" in p for p in check_trace([pilot, one_more], strict))
    assert check_trace([pilot, one_more], reference) == []
    two_more = dict(one_more, step=one_more["step"] + 1)
    assert any("age_rule reference" in p for p in check_trace([pilot, two_more], reference))


def test_a_pilot_or_commit_of_the_wrong_size_is_reported() -> None:
    cfg, events = _trace("pilot_commit")
    broken = copy.deepcopy(events)
    next(e for e in broken if e["event"] == "commit")["n"] += 1
    assert any("its group is not n = 8" in p for p in check_trace(broken, cfg))
    broken = copy.deepcopy(events)
    next(e for e in broken if e["event"] == "pilot")["n"] = 2  # a short pilot, but sized counts are off
    assert any("piloted with 2 rollouts, not 4" in p for p in check_trace(broken, cfg))
