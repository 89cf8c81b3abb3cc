"""The policy update of one training step, as the paper's reference recipe does it.

    old (and reference) log-probs: ONCE, over the whole batch, before the first update
    for each mini-batch: one optimizer update against those old log-probs
    the LR schedule advances once, with the step's last update

Computing the old log-probs per mini-batch (after the earlier mini-batches moved the policy)
would make the PPO ratio 1 at every update, so the clips would never bind and the update would
be plain policy gradient. ``policy`` is anything with ``call(method, *args)`` (the Ray group of
Megatron ranks, or an in-process stand-in in the tests).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence as Seq
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

from megatron_pc.allocation import TrainGroup
from megatron_pc.cluster.rollouts import groups_to_sequences
from megatron_pc.config import Config
from megatron_pc.training.batching import Sequence


class PolicyGroup(Protocol):
    """What the update needs of the policy (and reference) workers."""

    def call(self, method: str, *args: Any) -> Any:
        """Run ``method`` on every rank; rank 0's result."""


@dataclass
class MiniBatch:
    """One optimizer update: its sequences and the weight of its loss."""

    seqs: list[Sequence]
    loss_scale: float = 1.0


def mini_batches(groups: Seq[TrainGroup], prompt_tokens: Seq[Seq[int]], cfg: Config) -> list[MiniBatch]:
    """The step's updates under ``training.mini_batch_unit`` (see TrainingConfig)."""
    t = cfg.training
    if t.mini_batch_unit == "groups":
        return [MiniBatch(groups_to_sequences(groups[i : i + t.mini_batch], prompt_tokens, t.std_normalize))
                for i in range(0, len(groups), t.mini_batch)]  # fmt: skip
    # call_rollouts: verl sizes a mini-batch as mini_batch x the rollouts per prompt of one
    # generation call, and a short last one contributes in proportion to its size.
    a = cfg.allocation
    size = t.mini_batch * (a.commit_rollouts if a.strategy == "pilot_commit" else a.n)
    seqs = groups_to_sequences(groups, prompt_tokens, t.std_normalize)
    return [MiniBatch(seqs[i : i + size], len(seqs[i : i + size]) / size) for i in range(0, len(seqs), size)]


def update_policy(
    groups: Seq[TrainGroup],
    prompt_tokens: Seq[Seq[int]],
    cfg: Config,
    policy: PolicyGroup,
    reference: PolicyGroup | None,
    timer: Callable[[str], AbstractContextManager[Any]],
) -> dict[str, float]:
    """Old/reference log-probs once, then one optimizer update per mini-batch; the step's metrics."""
    batches = [b for b in mini_batches(groups, prompt_tokens, cfg) if b.seqs]
    if not batches:
        return {}
    every = [s for b in batches for s in b.seqs]
    with timer("logprob"):
        for s, lp in zip(every, policy.call("logprobs", every)):
            s.old_logprobs = lp
    if reference is not None:
        with timer("reference"):
            for s, lp in zip(every, reference.call("logprobs", every)):
                s.ref_logprobs = lp
    updates = []
    with timer("update"):
        for i, b in enumerate(batches):
            updates.append(policy.call("train_step", b.seqs, b.loss_scale, i == len(batches) - 1))
    return combine_updates(updates)


def combine_updates(updates: list[dict[str, float]]) -> dict[str, float]:
    """One step's metrics from its optimizer updates: the mean of every per-update metric (loss,
    grad norm, clip fractions, ratio, approx KL, entropy, ...), the first update's learning rate
    (all of a step's updates use the same one), ``update_ok`` 1 only if every update was
    applied, and ``updates``, their number."""
    if not updates:
        return {}
    keys = [k for k in updates[0] if k not in ("update_ok", "lr")]
    out = {k: math.fsum(u[k] for u in updates) / len(updates) for k in keys if all(k in u for u in updates)}
    out["update_ok"] = float(all(u["update_ok"] for u in updates))
    out["lr"] = updates[0]["lr"]
    out["updates"] = float(len(updates))
    return out


def response_metrics(lengths: Seq[int], finish_reasons: Seq[str]) -> dict[str, float]:
    """Response length mean and max, and the share cut at ``max_tokens``, of a step's rollouts."""
    if not lengths:
        return {}
    return {
        "response_length_mean": sum(lengths) / len(lengths),
        "response_length_max": float(max(lengths)),
        "truncated_share": sum(1 for f in finish_reasons if f == "length") / len(finish_reasons),
    }
