"""The step's policy update: old log-probs once per step, mini-batches, the schedule's count."""

from __future__ import annotations

import math
from contextlib import nullcontext

import numpy as np
import pytest

from megatron_pc.allocation import Rollout, TrainGroup
from megatron_pc.driver.update import combine_updates, plan_rows, update_policy
from megatron_pc.metrics.timing import response_metrics
from megatron_pc.config import load_config
from megatron_pc.training.payload import RolloutPayload, split_by_tokens
from standins import StandInGroup

PROMPTS = [[1, 2, 3]] * 64


def _groups(count: int, size: int, prompts: list[list[int]] = PROMPTS) -> list[TrainGroup]:
    """``count`` groups of ``size`` rollouts with mixed rewards and varied response tokens;
    group p's rollouts carry ``prompts[p]``."""
    return [
        TrainGroup(p, [Rollout(float(k % 2), bool(k % 2), RolloutPayload.of([4 + (p + k) % 5, 5, 6 + k % 3][: 1 + (p + k) % 3], [-1.0] * (1 + (p + k) % 3), "stop", prompts[p]))
                       for k in range(size)], step=1)  # fmt: skip
        for p in range(count)
    ]


def _cfg(*overrides: str):
    return load_config(None, ["allocation.train_batch=8", "allocation.n=4", "allocation.pilot.n=1", "allocation.pilot.batch=8", *overrides])


def test_old_logprobs_are_computed_once_so_the_ratio_is_one_only_at_the_first_of_four_updates() -> None:
    cfg = _cfg("training.mini_batch=2")
    policy = StandInGroup()
    metrics = update_policy(_groups(8, 4), cfg, policy, None, lambda _: nullcontext())
    ratios = [u["ratio_mean"] for u in policy.updates]
    assert len(ratios) == 4 and metrics["updates"] == 4
    assert policy.logprob_calls == 1
    assert ratios[0] == pytest.approx(1.0, abs=1e-7)
    assert all(abs(r - 1.0) > 1e-3 for r in ratios[1:])
    # The clip binds at the later updates, and the step reports the mean over its updates.
    assert max(u["clip_frac_low"] + u["clip_frac_high"] for u in policy.updates[1:]) > 0
    assert metrics["ratio_mean"] == pytest.approx(sum(ratios) / 4)
    assert metrics["approx_kl"] > 0


def test_the_schedule_advances_once_per_training_step_whatever_the_mini_batches() -> None:
    for mini_batch in (8, 2, 1):
        policy = StandInGroup()
        update_policy(_groups(8, 4), _cfg(f"training.mini_batch={mini_batch}"), policy, None, lambda _: nullcontext())
        assert len(policy.updates) == 8 // mini_batch
        assert policy.model.schedule_steps == 1


def test_reference_logprobs_are_computed_once_for_the_whole_batch() -> None:
    policy, reference = StandInGroup(), StandInGroup()
    update_policy(_groups(8, 4), _cfg("training.mini_batch=2"), policy, reference, lambda _: nullcontext())
    assert reference.logprob_calls == 1 and policy.logprob_calls == 1


def _sizes(plan) -> list[int]:
    return np.bincount(plan.update).tolist()


def test_call_rollouts_mini_batches_are_mini_batch_times_commit_n_rollouts_and_the_short_last_is_scaled() -> None:
    # PC with n 4 = 1 pilot + 3 commits: a mini-batch of 2 "prompts" is 2 x 3 = 6 rollouts, so
    # the 32 rollouts of 8 groups take 6 updates: 5 full and one of 2 rollouts (a third).
    cfg = _cfg("training.mini_batch=2", "training.mini_batch_unit=call_rollouts")
    plan = plan_rows(_groups(8, 4), cfg)
    assert _sizes(plan) == [6, 6, 6, 6, 6, 2]
    assert plan.loss_scales == [1, 1, 1, 1, 1, pytest.approx(1 / 3)]
    # GRPO scales by n instead: 2 x 4 = 8 rollouts, 4 updates.
    grpo = _cfg("training.mini_batch=2", "training.mini_batch_unit=call_rollouts", "allocation.strategy=grpo")
    assert _sizes(plan_rows(_groups(8, 4), grpo)) == [8, 8, 8, 8]


def test_groups_mini_batches_hold_whole_groups() -> None:
    plan = plan_rows(_groups(8, 4), _cfg("training.mini_batch=3"))
    assert _sizes(plan) == [12, 12, 8]
    assert plan.loss_scales == [1.0, 1.0, 1.0]
    # token-mean: each update's denominator is its response tokens
    assert plan.denominators == [float(sum(len(r.tokens) for r, k in zip(plan.responses, plan.update) if k == u)) for u in range(3)]


def test_rows_are_built_once_as_flat_arrays_with_the_rollouts_tokens() -> None:
    groups = _groups(2, 2, [[1, 2, 3], [9]])
    rows = plan_rows(groups, _cfg("training.mini_batch=1")).build()
    assert rows.tokens.dtype == np.int32 and rows.engine_logprobs.dtype == np.float32
    assert [s.tokens.tolist() for s in rows.sequences()] == [[1, 2, 3] + g.rollouts[k].data.tokens.tolist() for g in groups[:1] for k in range(2)] + \
        [[9] + g.rollouts[k].data.tokens.tolist() for g in groups[1:] for k in range(2)]
    assert rows.update.tolist() == [0, 0, 1, 1]
    assert rows.nbytes > 0


def test_each_dp_group_gets_every_row_once_balanced_by_tokens_with_a_row_of_every_update() -> None:
    lengths = np.array([10, 1, 1, 1, 9, 2, 5, 5, 5, 5])
    update = np.array([0, 0, 0, 0, 0, 0, 1, 1, 1, 1])
    shares = split_by_tokens(lengths, update, 2, 2)
    assert sorted(i for share in shares for i in share) == list(range(10))
    assert all(share == sorted(share) for share in shares)
    assert [sum(lengths[i] for i in share if update[i] == 0) for share in shares] == [12, 12]
    assert all({int(update[i]) for i in share} == {0, 1} for share in shares)
    with pytest.raises(ValueError, match="update 1 of the step has 4 rows for 5 data-parallel groups"):
        split_by_tokens(lengths, update, 2, 5)


def test_with_two_dp_groups_the_update_is_the_same_and_each_group_holds_only_its_share() -> None:
    cfg = _cfg("training.mini_batch=2")
    one, two = StandInGroup(1), StandInGroup(2)
    a = update_policy(_groups(8, 4), cfg, one, None, lambda _: nullcontext())
    b = update_policy(_groups(8, 4), cfg, two, None, lambda _: nullcontext())
    assert a == pytest.approx(b)
    held = [rank.rows.rows for rank in two.ranks]
    assert sum(held) == one.ranks[0].rows.rows == 32 and min(held) > 0


def test_combine_updates_means_every_metric_and_keeps_the_steps_learning_rate() -> None:
    updates = [
        {"loss": 0.5, "grad_norm": 2.0, "update_ok": 1.0, "lr": 1e-5, "clip_frac_low": 0.0, "entropy": 1.0},
        {"loss": -0.1, "grad_norm": 4.0, "update_ok": 0.0, "lr": 1e-5, "clip_frac_low": 0.2, "entropy": 3.0},
    ]
    out = combine_updates(updates)
    assert out == {"loss": pytest.approx(0.2), "grad_norm": 3.0, "clip_frac_low": pytest.approx(0.1), "entropy": 2.0,
                   "update_ok": 0.0, "lr": 1e-5, "updates": 2.0}  # fmt: skip
    assert combine_updates(updates[:1]) == {**updates[0], "updates": 1.0}
    assert combine_updates([]) == {}


def test_response_metrics_count_lengths_and_truncation() -> None:
    out = response_metrics([3, 5, 10, 2], ["stop", "length", "length", "stop"])
    assert out == {"response_length_mean": 5.0, "response_length_max": 10.0, "truncated_share": 0.5}
    assert response_metrics([], []) == {}
    assert math.isclose(response_metrics([1], ["stop"])["truncated_share"], 0.0)


def test_bench_step_takes_overrides_without_a_config_and_after_the_options() -> None:
    from benchmarks.step import parse_args

    args = parse_args(["--strategies", "grpo", "training.mini_batch=8", "--json"])
    assert (args.config, args.overrides, args.strategies, args.json) == ("configs/tiny_cpu.yaml", ["training.mini_batch=8"], "grpo", True)
    args = parse_args(["configs/x.yaml", "--out", "o", "a.b=1", "c.d=2"])
    assert (args.config, args.overrides, args.out) == ("configs/x.yaml", ["a.b=1", "c.d=2"], "o")
