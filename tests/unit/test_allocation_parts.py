"""Unit tests of the allocation pieces: buffer choice, pilot selection, trimming, trace file."""

from __future__ import annotations

import json

import pytest

from megatron_pc.allocation import Rollout, build_strategy
from megatron_pc.allocation.buffer import ReplayBuffer, select_kept_pilots
from megatron_pc.allocation.config import AllocationConfig, BufferConfig, PilotConfig
from megatron_pc.allocation.pilot_commit import fit_round_to_ranks
from megatron_pc.allocation.pool import PromptPool
from megatron_pc.allocation.trace import TraceWriter, read_trace

from allocation_helpers import BernoulliPolicy, run_steps


def _r(*wins: int) -> list[Rollout]:
    return [Rollout(float(w), bool(w)) for w in wins]


def test_max_variance_keeps_balanced_successes_and_failures_in_order() -> None:
    rollouts = _r(1, 1, 1, 0, 1, 0, 0, 1)
    kept = select_kept_pilots(rollouts, 4, "max_variance")
    assert [r.correct for r in kept] == [True, True, False, False]
    assert kept[0] is rollouts[0] and kept[2] is rollouts[3]


def test_max_variance_keeps_all_minority_outcomes_when_few() -> None:
    kept = select_kept_pilots(_r(1, 1, 1, 1, 1, 0), 4, "max_variance")
    assert sum(r.correct for r in kept) == 3 and sum(not r.correct for r in kept) == 1


def test_first_keeps_the_first_rollouts() -> None:
    rollouts = _r(1, 1, 1, 0)
    assert select_kept_pilots(rollouts, 2, "first") == rollouts[:2]


def test_buffer_max_variance_takes_highest_variance_then_most_recent() -> None:
    buf = ReplayBuffer(BufferConfig(sampling="max_variance"), seed=0)
    buf.push(prompt=1, pilot_step=1, successes=1, n_pilot=4, kept=[])  # p=.25
    buf.push(prompt=2, pilot_step=1, successes=2, n_pilot=4, kept=[])  # p=.5
    buf.push(prompt=3, pilot_step=2, successes=2, n_pilot=4, kept=[])  # p=.5, more recent
    buf.push(prompt=4, pilot_step=2, successes=3, n_pilot=4, kept=[])  # p=.75
    assert [e.prompt for e in buf.take(1)] == [3]
    assert [e.prompt for e in buf.take(1)] == [2]
    assert sorted(e.prompt for e in buf.take(5)) == [1, 4]
    assert len(buf) == 0


def test_buffer_drops_entries_that_would_commit_past_max_age() -> None:
    buf = ReplayBuffer(BufferConfig(max_age=2), seed=0)
    for step in (1, 2, 3):
        buf.push(prompt=step, pilot_step=step, successes=1, n_pilot=2, kept=[])
    assert buf.drop_older_than(next_step=4) == 1  # piloted at 1, would be 3 steps old
    assert [e.prompt for e in buf.entries()] == [2, 3]


def test_buffer_capacity_drops_the_oldest() -> None:
    buf = ReplayBuffer(BufferConfig(capacity=2), seed=0)
    assert buf.push(1, 1, 1, 2, []) == 0
    assert buf.push(2, 1, 1, 2, []) == 0
    assert buf.push(3, 2, 1, 2, []) == 1
    assert [e.prompt for e in buf.entries()] == [2, 3]


@pytest.mark.parametrize(
    "pilots,pilot_n,commits,commit_n,ranks,expected",
    [
        (12, 4, 5, 12, 1, (12, 5)),
        (12, 4, 5, 12, 8, (12, 4)),  # 48 + 12k divisible by 8 -> k even
        (7, 4, 3, 12, 8, (7, 3)),  # 28 + 36 = 64
        (1, 4, 0, 12, 8, (0, 0)),  # nothing fits: the round is empty
        (3, 4, 1, 3, 8, (2, 0)),  # 12+3 no, 12 no; 8 yes
    ],
)
def test_fit_round_to_ranks(pilots: int, pilot_n: int, commits: int, commit_n: int, ranks: int, expected: tuple[int, int]) -> None:
    got = fit_round_to_ranks(pilots, pilot_n, commits, commit_n, ranks)
    assert got == expected
    assert (got[0] * pilot_n + got[1] * commit_n) % ranks == 0


def test_rounds_divide_evenly_over_generation_ranks() -> None:
    cfg = AllocationConfig(train_batch=16, n=16, pilot=PilotConfig(n=4, batch=48))  # commit_n = 12
    strategy = build_strategy(cfg, 500, 3, generation_ranks=8)
    rates = [0.5] * 500
    policy = BernoulliPolicy(rates, 3)
    for _ in range(6):
        while not strategy.batch_ready():
            plan = strategy.plan_round()
            assert plan.total_rollouts % 8 == 0
            strategy.observe(plan, policy.generate(plan))
        strategy.finish_step()


def test_pool_draw_with_exclude_keeps_passed_prompts_next_in_line() -> None:
    pool = PromptPool(6, seed=0)
    pool.draw(6)
    pool.end_epoch()
    first = pool._order[:3]
    got = pool.draw(2, exclude={first[0]})
    assert got == first[1:3]
    assert pool.draw(1) == [first[0]]


def test_evicted_prompts_leave_every_later_epoch() -> None:
    pool = PromptPool(10, seed=1)
    pool.draw(10)
    pool.evict(4)
    pool.defer(5)
    assert pool.state(4) == "evicted" and pool.state(5) == "deferred"
    pool.end_epoch()
    assert pool.state(5) == "active"
    assert sorted(pool.draw(100)) == [0, 1, 2, 3, 5, 6, 7, 8, 9]


def test_trace_writer_resume_cuts_events_after_the_checkpointed_step(tmp_path) -> None:
    path = tmp_path / "trace.jsonl"
    writer = TraceWriter(path)
    for step in (1, 2, 3):
        writer.emit({"event": "step_end", "step": step})
    writer.flush()
    with path.open("a") as f:
        f.write('{"event": "pilot", "st')  # a torn line from a crash
    TraceWriter(path, keep_through_step=2)
    assert [e["step"] for e in read_trace(path)] == [1, 2]


def test_trace_of_a_run_has_every_required_field(tmp_path) -> None:
    path = tmp_path / "trace.jsonl"
    cfg = AllocationConfig(train_batch=4, n=8, pilot=PilotConfig(n=4, batch=8))
    strategy = build_strategy(cfg, 40, 0, trace=TraceWriter(path))
    run_steps(strategy, BernoulliPolicy([0.5] * 40), 12)  # 40 prompts / 8 per round: crosses epochs
    required = {
        "pilot": {"step", "round", "prompt", "n", "successes", "decision", "evict"},
        "commit": {"step", "round", "prompt", "n", "pilot_step"},
        "train_group": {"step", "prompt", "size", "successes"},
        "step_end": {"step", "generated", "trained", "buffer_size", "age_evicted"},
        "epoch_end": {"epoch", "evicted_total"},
    }
    events = read_trace(path)
    seen = {e["event"] for e in events}
    assert seen == set(required)
    for e in events:
        assert required[e["event"]] <= set(e), e
        if e["event"] == "step_end":
            assert set(e["generated"]) == {"pilot", "commit", "full"}
    json.dumps(events)
