"""The step's policy update: old log-probs once per step, mini-batches, the schedule's count."""

from __future__ import annotations

import math
from contextlib import nullcontext

import pytest
import torch

from megatron_pc.algo.losses import policy_loss
from megatron_pc.allocation import Rollout, TrainGroup
from megatron_pc.cluster.update import combine_updates, mini_batches, response_metrics, update_policy
from megatron_pc.config import load_config

PROMPTS = [[1, 2, 3]] * 64


def _groups(count: int, size: int) -> list[TrainGroup]:
    """``count`` groups of ``size`` rollouts with mixed rewards and varied response tokens."""
    return [
        TrainGroup(p, [Rollout(float(k % 2), bool(k % 2), {"tokens": [4 + (p + k) % 5, 5, 6 + k % 3], "logprobs": [-1.0] * 3, "finish": "stop"})
                       for k in range(size)], step=1)  # fmt: skip
        for p in range(count)
    ]


class StandInPolicy:
    """A deterministic policy with one parameter ``theta``: log p(token) = -theta * (1 + token % 7) / 10.

    Each update scores its mini-batch with the project's real loss (so ``ratio_mean`` is
    exactly what the Megatron workers would report) and then moves ``theta``.
    """

    def __init__(self) -> None:
        self.theta = 1.0
        self.logprob_calls = 0
        self.schedule_steps = 0
        self.updates: list[dict[str, float]] = []
        self.loss_scales: list[float] = []

    def _logprobs(self, seq) -> list[float]:
        return [-self.theta * (1 + t % 7) / 10 for t in seq.tokens[seq.prompt_len :]]

    def call(self, method: str, *args):
        return getattr(self, method)(*args)

    def logprobs(self, seqs) -> list[list[float]]:
        self.logprob_calls += 1
        return [self._logprobs(s) for s in seqs]

    def train_step(self, seqs, loss_scale: float = 1.0, last_update: bool = True) -> dict[str, float]:
        width = max(s.response_len for s in seqs)
        current, old, mask = (torch.zeros(len(seqs), width) for _ in range(3))
        for row, s in enumerate(seqs):
            current[row, : s.response_len] = torch.tensor(self._logprobs(s))
            old[row, : s.response_len] = torch.tensor(s.old_logprobs)
            mask[row, : s.response_len] = 1.0
        advantages = torch.tensor([s.advantage for s in seqs])
        loss, metrics = policy_loss(current, old, advantages, mask, clip_low=0.2, clip_high=0.28, dual_clip=10.0, loss_agg="token-mean")
        self.theta += 0.3  # the update moves the policy
        self.loss_scales.append(loss_scale)
        if last_update:
            self.schedule_steps += 1
        out = {"loss": float(loss), "grad_norm": 1.0, "update_ok": 1.0, "lr": 1e-3, **metrics}
        self.updates.append(out)
        return out


def _cfg(*overrides: str):
    return load_config(None, ["allocation.train_batch=8", "allocation.n=4", "allocation.pilot.n=1", "allocation.pilot.batch=8", *overrides])


def test_old_logprobs_are_computed_once_so_the_ratio_is_one_only_at_the_first_of_four_updates() -> None:
    cfg = _cfg("training.mini_batch=2")
    policy = StandInPolicy()
    metrics = update_policy(_groups(8, 4), PROMPTS, cfg, policy, None, lambda _: nullcontext())
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
        policy = StandInPolicy()
        update_policy(_groups(8, 4), PROMPTS, _cfg(f"training.mini_batch={mini_batch}"), policy, None, lambda _: nullcontext())
        assert len(policy.updates) == 8 // mini_batch
        assert policy.schedule_steps == 1


def test_reference_logprobs_are_computed_once_for_the_whole_batch() -> None:
    policy, reference = StandInPolicy(), StandInPolicy()
    update_policy(_groups(8, 4), PROMPTS, _cfg("training.mini_batch=2"), policy, reference, lambda _: nullcontext())
    assert reference.logprob_calls == 1 and policy.logprob_calls == 1


def test_call_rollouts_mini_batches_are_mini_batch_times_commit_n_rollouts_and_the_short_last_is_scaled() -> None:
    # PC with n 4 = 1 pilot + 3 commits: a mini-batch of 2 "prompts" is 2 x 3 = 6 rollouts, so
    # the 32 rollouts of 8 groups take 6 updates: 5 full and one of 2 rollouts (a third).
    cfg = _cfg("training.mini_batch=2", "training.mini_batch_unit=call_rollouts")
    batches = mini_batches(_groups(8, 4), PROMPTS, cfg)
    assert [len(b.seqs) for b in batches] == [6, 6, 6, 6, 6, 2]
    assert [b.loss_scale for b in batches] == [1, 1, 1, 1, 1, pytest.approx(1 / 3)]
    # GRPO scales by n instead: 2 x 4 = 8 rollouts, 4 updates.
    grpo = _cfg("training.mini_batch=2", "training.mini_batch_unit=call_rollouts", "allocation.strategy=grpo")
    assert [len(b.seqs) for b in mini_batches(_groups(8, 4), PROMPTS, grpo)] == [8, 8, 8, 8]


def test_groups_mini_batches_hold_whole_groups() -> None:
    batches = mini_batches(_groups(8, 4), PROMPTS, _cfg("training.mini_batch=3"))
    assert [len(b.seqs) for b in batches] == [12, 12, 8]
    assert all(b.loss_scale == 1.0 for b in batches)


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
    from megatron_pc.bench.step import parse_args

    args = parse_args(["--strategies", "grpo", "training.mini_batch=8", "--json"])
    assert (args.config, args.overrides, args.strategies, args.json) == ("configs/tiny_cpu.yaml", ["training.mini_batch=8"], "grpo", True)
    args = parse_args(["configs/x.yaml", "--out", "o", "a.b=1", "c.d=2"])
    assert (args.config, args.overrides, args.out) == ("configs/x.yaml", ["a.b=1", "c.d=2"], "o")
