"""training.loss_denominator: ``informative`` divides an update's loss by the tokens of groups
with a nonzero advantage only (the ``grpo_fair`` control of bench rollouts)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from megatron_pc.algo.losses import policy_loss
from megatron_pc.allocation import Rollout, TrainGroup
from megatron_pc.config import load_config
from megatron_pc.driver.update import informative_rows, plan_rows
from megatron_pc.errors import ConfigError
from megatron_pc.training.payload import RolloutPayload

PROMPTS = [[1, 2, 3]] * 8


def _group(prompt: int, rewards: list[float]) -> TrainGroup:
    """A group whose k-th rollout has 1 + (k + prompt) % 3 response tokens."""
    rollouts = [Rollout(r, bool(r), RolloutPayload.of([5] * (1 + (k + prompt) % 3), [-1.0] * (1 + (k + prompt) % 3), "stop", PROMPTS[prompt]))
                for k, r in enumerate(rewards)]  # fmt: skip
    return TrainGroup(prompt, rollouts, step=1)


# Groups 1 and 3 are zero-variance (all wrong, all right): their rows carry no gradient.
GROUPS = [_group(0, [1, 0, 1, 0]), _group(1, [0, 0, 0, 0]), _group(2, [0, 1, 1, 1]), _group(3, [1, 1, 1, 1])]


def _cfg(denominator: str, *more: str):
    return load_config(None, ["allocation.strategy=grpo", "allocation.train_batch=4", "allocation.n=4", "training.mini_batch=4",
                              f"training.loss_denominator={denominator}", *more])  # fmt: skip


def _tokens(plan, groups: set[int]) -> float:
    group_of = np.repeat(np.arange(len(GROUPS)), 4)
    return float(sum(len(r.tokens) for r, g in zip(plan.responses, group_of) if g in groups))


def test_informative_denominator_counts_only_the_tokens_of_groups_with_a_nonzero_advantage() -> None:
    everything = plan_rows(GROUPS, _cfg("all"))
    fair = plan_rows(GROUPS, _cfg("informative"))
    assert everything.denominators == [_tokens(everything, {0, 1, 2, 3})]
    assert fair.denominators == [_tokens(fair, {0, 2})] and fair.denominators[0] < everything.denominators[0]
    # Same rows, same advantages: only the denominator changes.
    assert fair.advantages == everything.advantages and fair.update.tolist() == everything.update.tolist()


def test_informative_loss_and_gradient_are_the_all_token_ones_rescaled() -> None:
    everything = plan_rows(GROUPS, _cfg("all"))
    fair = plan_rows(GROUPS, _cfg("informative"))
    lengths = [len(r.tokens) for r in everything.responses]
    width = max(lengths)
    mask = torch.tensor([[1.0] * n + [0.0] * (width - n) for n in lengths])
    torch.manual_seed(0)
    old = -torch.rand(len(lengths), width)
    advantages = torch.tensor(everything.advantages, dtype=torch.float32)

    def loss_and_grad(denominator: float) -> tuple[float, torch.Tensor]:
        logprobs = (old + 0.05 * torch.randn(old.shape, generator=torch.Generator().manual_seed(1))).requires_grad_()
        loss, _ = policy_loss(logprobs, old, advantages, mask, clip_low=0.2, clip_high=0.28, dual_clip=10.0,
                              loss_agg="token-mean", denominator=denominator)  # fmt: skip
        loss.backward()
        return float(loss.detach()), logprobs.grad

    loss_all, grad_all = loss_and_grad(everything.denominators[0])
    loss_fair, grad_fair = loss_and_grad(fair.denominators[0])
    factor = everything.denominators[0] / fair.denominators[0]
    assert factor > 1 and loss_fair == pytest.approx(loss_all * factor, rel=1e-5)
    assert torch.allclose(grad_fair, grad_all * factor, rtol=1e-5, atol=1e-8)
    # The zero-variance groups' rows have no gradient under either denominator.
    dead = torch.tensor(~informative_rows(everything.advantages, np.repeat(np.arange(4), 4)))
    assert dead.sum() == 8 and float(grad_fair[dead].abs().sum()) == 0.0 and float(grad_fair[~dead].abs().sum()) > 0


def test_each_update_counts_its_own_informative_rows_and_one_without_any_keeps_its_all_count() -> None:
    # One group per update: the updates of groups 1 and 3 hold no informative row.
    fair = plan_rows(GROUPS, _cfg("informative", "training.mini_batch=1"))
    everything = plan_rows(GROUPS, _cfg("all", "training.mini_batch=1"))
    assert fair.denominators == everything.denominators
    seq = plan_rows(GROUPS, _cfg("informative", "training.loss_agg=seq-mean-token-mean"))
    assert seq.denominators == [8.0]  # the 8 rows of groups 0 and 2


def test_informative_rows_marks_whole_groups() -> None:
    assert informative_rows([0.0, 0.0, 0.5, -0.5, 0.0, 0.0], [0, 0, 1, 1, 2, 2]).tolist() == [False, False, True, True, False, False]
    assert informative_rows([], []).tolist() == []


def test_an_unknown_loss_denominator_is_refused_naming_the_field() -> None:
    with pytest.raises(ConfigError, match="loss_denominator"):
        _cfg("some")


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_the_plan_the_worker_rows_and_the_mask_agree_on_every_updates_denominator(agg: str) -> None:
    """One rule (algo.losses.loss_denominator): the driver's plan of each update, the rows a
    worker builds from it and the mask of those rows collated into a micro-batch give the same
    denominator, for every aggregation."""
    from megatron_pc.algo.losses import aggregate, loss_denominator
    from megatron_pc.training.batching import collate

    plan = plan_rows(GROUPS, _cfg("all", f"training.loss_agg={agg}", "training.mini_batch=2"))
    assert len(plan.denominators) == 2
    seqs = plan.build().sequences()
    for k, planned in enumerate(plan.denominators):
        mine = [s for s, u in zip(seqs, plan.update) if u == k]
        batch = collate(mine, list(range(len(mine))))
        assert loss_denominator([s.response_len for s in mine], agg) == planned
        assert loss_denominator(batch.mask.sum(-1), agg) == planned
        ones = torch.ones_like(batch.mask)  # a loss of 1 per token: the local mean divides by the same count
        assert aggregate(ones, batch.mask, agg).item() * planned == pytest.approx(aggregate(ones, batch.mask, agg, denominator=1.0).item())
