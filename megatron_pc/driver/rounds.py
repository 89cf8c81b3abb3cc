"""A round of generation: the strategy's plan resolved once against the data, the engine
calls, and the rewarded rollouts handed back to the strategy.

The plan names prompts by pool index; :func:`resolve_round` looks each one up once and the
round carries the result (token ids for the engines, the answer for the reward) to the end.
Each sample becomes a :class:`Rollout` whose opaque ``data`` is a :class:`RolloutPayload`
(response tokens, the engine's log-probs, the finish reason, as numpy arrays, and its request's
prompt token ids), so the update and the sync check take the prompt from the rollout.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import numpy as np

from megatron_pc.allocation import Rollout, RoundPlan
from megatron_pc.allocation.types import RequestKind
from megatron_pc.config import Config
from megatron_pc.rollout.base import GenerationRequest, GenerationResult, SamplingSettings, derive_seed, merge_results
from megatron_pc.training.payload import RolloutPayload


@dataclass(frozen=True)
class PromptRequest:
    """One planned request with what generation and the reward need of its prompt."""

    prompt: int
    """The prompt's pool index: its group's id for the strategy and the update."""
    kind: RequestKind
    n: int
    token_ids: tuple[int, ...]
    answer: str

    @property
    def generation(self) -> GenerationRequest:
        """The engine's request: the prompt's token ids and the number of samples."""
        return GenerationRequest(self.token_ids, self.n)


def resolve_round(plan: RoundPlan, token_ids: Sequence[Sequence[int]], answers: Callable[[int], str]) -> list[PromptRequest]:
    """The plan's requests, in plan order, each with its prompt's token ids and answer
    (``answers(prompt)``): the one lookup of a prompt on its way to the update."""
    return [PromptRequest(r.prompt, r.kind, r.n, tuple(token_ids[r.prompt]), answers(r.prompt)) for r in plan.requests]


def generate_round(
    engines: Any, plan: RoundPlan, requests: Sequence[PromptRequest], cfg: Config, timer: Callable[[str], AbstractContextManager[Any]]
) -> tuple[GenerationResult, int]:
    """The round's samples in request order, and the engine calls made: one with binding (pilots
    and commits share the call), else new prompts first, then commits. Seeds depend only on
    the run's seed, the step, the round and the call."""
    parts = [list(range(len(requests)))]
    if not cfg.allocation.binding:
        new = [i for i, r in enumerate(requests) if r.kind != "commit"]
        commits = [i for i, r in enumerate(requests) if r.kind == "commit"]
        parts = [p for p in (new, commits) if p]
    outs = []
    for k, part in enumerate(parts):
        seed = derive_seed(cfg.seed, "round", plan.step, plan.round, *(["call", k] if k else []))
        with timer("generate"):
            outs.append(engines.generate([requests[i].generation for i in part], SamplingSettings.from_config(cfg.rollout, seed=seed)))
    out = outs[0] if len(outs) == 1 else merge_results(outs, parts, len(requests))
    return out, len(parts)


def answers_of(requests: Sequence[PromptRequest]) -> list[str]:
    """The answer every sample of the round is graded against, in request then sample order."""
    return [r.answer for r in requests for _ in range(r.n)]


def to_rollouts(requests: Sequence[PromptRequest], result: GenerationResult, rewards: Sequence[tuple[float, bool]]) -> list[list[Rollout]]:
    """Per request, its ``n`` samples with their (reward, correct), in request order; a
    ValueError when the result does not hold exactly each request's samples."""
    if len(result.samples) != len(requests):
        raise ValueError(f"the engines returned samples for {len(result.samples)} requests, the round made {len(requests)}")
    out: list[list[Rollout]] = []
    flat = iter(rewards)
    for request, samples in zip(requests, result.samples):
        if len(samples) != request.n:
            raise ValueError(f"prompt {request.prompt}: {len(samples)} samples where {request.n} were asked for")
        prompt = np.asarray(request.token_ids, dtype=np.int32)  # one array, shared by the group's rollouts
        group = []
        for s in samples:
            reward, correct = next(flat)
            group.append(Rollout(reward, correct, RolloutPayload.of(s.token_ids, s.logprobs, s.finish_reason, prompt)))
        out.append(group)
    if next(flat, None) is not None:
        raise ValueError("more rewards than samples")
    return out
