"""The trace checker accepts real traces and names what is wrong in broken ones."""

from __future__ import annotations

import copy

import pytest

from megatron_pc.allocation import build_strategy
from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.config import AllocationConfig, PilotConfig
from megatron_pc.allocation.trace import ListTrace

from allocation_helpers import BernoulliPolicy, run_steps, spread_rates


def _trace(strategy: str) -> tuple[AllocationConfig, list[dict]]:
    cfg = AllocationConfig(strategy=strategy, train_batch=6, n=8, pilot=PilotConfig(n=4, batch=12), max_rounds=20)
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
