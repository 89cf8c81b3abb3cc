"""Glue between the allocation strategy, the engines, the reward pool and the policy.

A round's plan becomes one engine call; each sample becomes a :class:`Rollout` whose opaque
``data`` is a :class:`RolloutPayload` (response tokens, the engine's log-probs, the finish
reason, as numpy arrays). A finished step's groups become Megatron :class:`Sequence` rows with GRPO advantages
computed per group.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence as Seq

import torch

from megatron_pc.algo.advantages import group_advantages
from megatron_pc.allocation import Rollout, RoundPlan, TrainGroup
from megatron_pc.rollout.base import GenerationRequest, GenerationResult
from megatron_pc.training.batching import Sequence
from megatron_pc.training.payload import RolloutPayload, as_payload


@dataclass
class RoundOutcome:
    """What a round produced, for metrics."""

    rollouts: list[list[Rollout]]
    generated_tokens: int
    generate_seconds: float
    reward_seconds: float


def plan_to_requests(plan: RoundPlan, prompt_tokens: Seq[Seq[int]]) -> list[GenerationRequest]:
    """One engine request per planned request, in plan order: pilots and commits together."""
    return [GenerationRequest(tuple(prompt_tokens[r.prompt]), r.n) for r in plan.requests]


def to_rollouts(result: GenerationResult, rewards: Seq[tuple[float, bool]]) -> list[list[Rollout]]:
    """Pair every sample with its (reward, correct), keeping per-request grouping and order."""
    out: list[list[Rollout]] = []
    flat = iter(rewards)
    for samples in result.samples:
        group = []
        for s in samples:
            reward, correct = next(flat)
            group.append(Rollout(reward, correct, RolloutPayload.of(s.token_ids, s.logprobs, s.finish_reason)))
        out.append(group)
    if next(flat, None) is not None:
        raise ValueError("more rewards than samples")
    return out


def groups_to_sequences(groups: Seq[TrainGroup], prompt_tokens: Seq[Seq[int]], std_normalize: bool) -> list[Sequence]:
    """Training rows of a step: prompt + response per rollout, advantage shared per group.

    Rollouts with an empty response carry no trainable token and are left out (their reward
    still counted in the group's baseline).
    """
    if not groups:
        return []
    advantages = rollout_advantages(groups, std_normalize)
    seqs = []
    k = 0
    for g in groups:
        prompt = list(prompt_tokens[g.prompt])
        for r in g.rollouts:
            payload = as_payload(r.data)
            if len(payload.tokens):
                seqs.append(Sequence(prompt + payload.tokens.tolist(), len(prompt), advantages[k], engine_logprobs=payload.logprobs.tolist()))
            k += 1
    return seqs


def rollout_advantages(groups: Seq[TrainGroup], std_normalize: bool) -> list[float]:
    """The GRPO advantage of every rollout of ``groups``, in order, normalised per group."""
    rewards = torch.tensor([r.reward for g in groups for r in g.rollouts], dtype=torch.float64)
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g.rollouts], dtype=torch.int64)
    return group_advantages(rewards, ids, std_normalize=std_normalize).tolist()
