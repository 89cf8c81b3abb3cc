"""The policy update of one training step, as the paper's reference recipe does it.

    rows: each DP group's share (balanced by tokens) into the object store, ONCE
    old (and reference) log-probs: ONCE, over the whole batch, before the first update,
        computed on the workers and kept there
    for each mini-batch: one optimizer update against those old log-probs
    the LR schedule advances once, with the step's last update

Computing the old log-probs per mini-batch (after the earlier mini-batches moved the policy)
would make the PPO ratio 1 at every update, so the clips would never bind and the update would
be plain policy gradient. ``policy`` is a :class:`PolicyGroup` (the Ray group of Megatron ranks,
or an in-process stand-in in the tests).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence as Seq
from contextlib import AbstractContextManager
from typing import Any, Protocol

import numpy as np

from megatron_pc.algo.advantages import rollout_advantages
from megatron_pc.algo.losses import loss_denominator
from megatron_pc.allocation import STRATEGIES, TrainGroup
from megatron_pc.config import Config
from megatron_pc.training.batching import Sequence
from megatron_pc.training.payload import RolloutPayload, RowPlan, as_payload


class PolicyGroup(Protocol):
    """What the driver needs of the policy (and reference) workers: the Ray group of Megatron
    ranks (megatron_pc.cluster.policy_group.MegatronGroup, whose every verb is checked against
    its rank's method), or an in-process stand-in. A per-group argument or result holds one
    value per data-parallel group."""

    def put_shares(self, plan: RowPlan) -> list[Any]:
        """Each DP group's share of the step's rows, stored once; a handle per group."""

    def load_rows(self, rows: Seq[Any]) -> list[int]:
        """Each DP group takes its share (``rows[dp]``); its row count per group."""

    def old_logprobs(self) -> None:
        """The loaded rows' log-probs under the current policy become their old log-probs."""

    def ref_logprobs(self) -> list[Any]:
        """The loaded rows' log-probs (a reference group's), flat, a handle per DP group."""

    def set_ref_logprobs(self, flat: Seq[Any]) -> None:
        """Each DP group takes its reference log-probs (``flat[dp]``)."""

    def train_update(self, update: int, last_update: bool) -> dict[str, float]:
        """Optimizer update ``update`` of the step; its metrics."""

    def logprobs(self, seqs: list[Any]) -> list[list[float]] | None:
        """Per-response-token log-probs of each sequence."""

    def load_hf(self, path: str) -> None:
        """Load Hugging Face weights."""

    def load(self, path: str) -> None:
        """Load a distributed checkpoint."""

    def save(self, path: str) -> None:
        """Write a distributed checkpoint."""

    def offload_for_generation(self, colocated: bool) -> dict[str, float]:
        """Free what generation does not need before colocated engines wake."""


def trained_rollouts(groups: Seq[TrainGroup], std_normalize: bool) -> Iterator[tuple[int, RolloutPayload, float]]:
    """(group index, payload, advantage) of every rollout that has a response, in order;
    advantages normalised per group. An empty response counts in its group's baseline but
    carries no trainable token, so it is left out."""
    advantages = rollout_advantages(groups, std_normalize)
    k = 0
    for gi, g in enumerate(groups):
        for r in g.rollouts:
            payload = as_payload(r.data)
            if len(payload.tokens):
                yield gi, payload, advantages[k]
            k += 1


def groups_to_sequences(groups: Seq[TrainGroup], std_normalize: bool) -> list[Sequence]:
    """The rows of :func:`trained_rollouts` as Megatron sequences (the rollout's prompt +
    response), with the engine's log-probs (the sync check scores them on both sides)."""
    return [Sequence(p.prompt.tolist() + p.tokens.tolist(), len(p.prompt), adv, engine_logprobs=p.logprobs.tolist())
            for _, p, adv in trained_rollouts(groups, std_normalize)]  # fmt: skip


def plan_rows(groups: Seq[TrainGroup], cfg: Config) -> RowPlan:
    """The step's training rows and their updates under ``training.mini_batch_unit`` (see
    TrainingConfig): one row per rollout with a response (its prompt is the one it carries),
    advantages normalised per group."""
    t, a = cfg.training, cfg.allocation
    prompts, responses, advs, group_of = [], [], [], []
    for gi, payload, advantage in trained_rollouts(groups, t.std_normalize):
        prompts.append(payload.prompt)
        responses.append(payload)
        advs.append(advantage)
        group_of.append(gi)
    if t.mini_batch_unit == "groups":
        raw = [gi // t.mini_batch for gi in group_of]
        size = None
    else:
        # call_rollouts: verl sizes a mini-batch as mini_batch x the rollouts per prompt of one
        # generation call, and a short last one contributes in proportion to its size.
        size = t.mini_batch * STRATEGIES[a.strategy].rollouts_per_call(a)
        raw = [i // size for i in range(len(responses))]
    compact = {u: k for k, u in enumerate(sorted(set(raw)))}  # mini-batches with no row drop out
    update = np.array([compact[u] for u in raw], dtype=np.int32)
    counts = np.bincount(update, minlength=len(compact)) if len(update) else np.zeros(0, np.int64)
    counted = informative_rows(advs, group_of) if t.loss_denominator == "informative" else np.ones(len(advs), dtype=bool)
    denominators = [loss_denominator([len(responses[i].tokens) for i in _counted(np.flatnonzero(update == k), counted)], t.loss_agg)
                    for k in range(len(compact))]  # fmt: skip
    scales = [1.0 if size is None else float(c) / size for c in counts]
    return RowPlan(prompts, responses, advs, update, denominators, scales)


def informative_rows(advantages: Seq[float], group_of: Seq[int]) -> np.ndarray:
    """Per row: does its group hold a nonzero advantage (``training.loss_denominator=informative``
    counts only those rows; a zero-variance group's rows all have advantage 0)."""
    adv, group = np.asarray(advantages, dtype=np.float64), np.asarray(group_of, dtype=np.int64)
    if not len(adv):
        return np.zeros(0, dtype=bool)
    live = np.zeros(int(group.max()) + 1, dtype=bool)
    np.logical_or.at(live, group, adv != 0.0)
    return live[group]


def _counted(members: np.ndarray, counted: np.ndarray) -> np.ndarray:
    """The rows of one update its loss denominator counts: its ``counted`` rows, or all its rows
    when none is counted (its policy-gradient loss is 0 then anyway)."""
    return members[counted[members]] if counted[members].any() else members


def update_policy(
    groups: Seq[TrainGroup],
    cfg: Config,
    policy: PolicyGroup,
    reference: PolicyGroup | None,
    timer: Callable[[str], AbstractContextManager[Any]],
) -> dict[str, float]:
    """Each DP group's rows sent once; old/reference log-probs once, on the workers; then one
    optimizer update per mini-batch. Only the step's metrics come back."""
    plan = plan_rows(groups, cfg)
    if not plan.rows:
        return {}
    with timer("dispatch"):
        shares = policy.put_shares(plan)
        policy.load_rows(shares)
    with timer("logprob"):
        policy.old_logprobs()
    if reference is not None:
        with timer("reference"):
            reference.load_rows(shares)
            # Each DP group's reference log-probs stay in the object store: the driver passes
            # the handle on, the policy ranks of that group read the values.
            policy.set_ref_logprobs(reference.ref_logprobs())
    updates = []
    with timer("update"):
        last = len(plan.denominators) - 1
        for k in range(last + 1):
            updates.append(policy.train_update(k, k == last))
    lengths = plan.lengths
    # What the step's FLOPs are counted from (megatron_pc.metrics.mfu): its tokens, and the
    # (query, key) pairs causal attention scores (T^2 / 2 for a sequence of T tokens).
    return {**combine_updates(updates), "trained_tokens": float(lengths.sum()), "trained_attention_pairs": float((lengths**2).sum() / 2)}


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
