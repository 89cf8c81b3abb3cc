"""A round of generation: the strategy's plan resolved once against the data, the engine
calls, and the rewarded rollouts handed back to the strategy.

The plan names prompts by pool index; :func:`resolve_round` looks each one up once and the
round carries the result (token ids for the engines, the answer, data source and extra info for
the reward) to the end.
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
from megatron_pc.data.records import PromptRecord
from megatron_pc.driver.scoring import Grading, grading_of
from megatron_pc.reward.pool import RewardResult
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
    grading: Grading
    """What the reward needs of the prompt: its answer, data source, extra info."""

    @property
    def generation(self) -> GenerationRequest:
        """The engine's request: the prompt's token ids and the number of samples."""
        return GenerationRequest(self.token_ids, self.n)


def resolve_round(plan: RoundPlan, token_ids: Sequence[Sequence[int]], records: Callable[[int], PromptRecord]) -> list[PromptRequest]:
    """The plan's requests, in plan order, each with its prompt's token ids and grading context
    (from ``records(prompt)``): the one lookup of a prompt on its way to the update."""
    return [PromptRequest(r.prompt, r.kind, r.n, tuple(token_ids[r.prompt]), grading_of(records(r.prompt))) for r in plan.requests]


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


def gradings_of(requests: Sequence[PromptRequest]) -> list[Grading]:
    """What every sample of the round is graded against, in request then sample order."""
    return [r.grading for r in requests for _ in range(r.n)]


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


def sample_rows(
    step: int, requests: Sequence[PromptRequest], texts: Sequence[str], results: Sequence[RewardResult], limit: int,
    records: Callable[[int], PromptRecord],
) -> list[dict[str, Any]]:
    """Up to ``limit`` of the round's samples as samples.jsonl rows (metrics/samples.py): the first
    sample of each request in order, then the second of each, ..., so that they show as many
    prompts as they can; only the rows kept are built."""
    starts, first = [], 0  # index of each request's first sample in texts / results
    for request in requests:
        starts.append(first)
        first += request.n
    rows: list[dict[str, Any]] = []
    k = 0
    while len(rows) < limit and any(r.n > k for r in requests):
        for request, start in zip(requests, starts):
            if len(rows) >= limit:
                break
            if request.n > k:
                i, record = start + k, records(request.prompt)
                rows.append({"step": step, "prompt_id": record.id, "prompt_index": request.prompt, "kind": request.kind,
                             "prompt": record.to_row()["prompt"], "response": texts[i], "reward": results[i].reward,
                             "correct": results[i].correct})  # fmt: skip
        k += 1
    return rows
