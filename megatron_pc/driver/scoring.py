"""Rewarding samples: decode the engines' token ids once, grade the texts in the reward pool.

Training rounds and validation both come here. :func:`decode_samples` and :func:`score_texts`
are apart so that a caller that also keeps the texts (validation's answer files, maj@k, the
samples log) decodes them only once; :func:`decode_and_score` composes the two.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from megatron_pc.data.records import PromptRecord
from megatron_pc.reward.pool import RewardPool, RewardResult
from megatron_pc.rollout.base import GenerationResult

__all__ = ["Grading", "grading_of", "decode_samples", "score_texts", "decode_and_score", "reward_metrics"]


@dataclass(frozen=True)
class Grading:
    """What the reward function is given about a prompt besides the response: the reference
    answer, the data source (routes ``reward.by_source``; verl's ``data_source``) and
    ``extra_info`` (the prompt's id, and its difficulty when known)."""

    answer: str
    source: str | None
    extra_info: dict[str, Any]


def grading_of(record: PromptRecord) -> Grading:
    """The grading context of one prompt record."""
    extra: dict[str, Any] = {"id": record.id}
    if record.difficulty is not None:
        extra["difficulty"] = record.difficulty
    return Grading(record.answer, record.source, extra)


def decode_samples(tokenizer: Any, result: GenerationResult) -> list[str]:
    """The text of every sample, in request order then sample order."""
    return tokenizer.batch_decode([s.token_ids for per_request in result.samples for s in per_request], skip_special_tokens=True)


def score_texts(texts: Sequence[str], result: GenerationResult, gradings: Sequence[Grading], rewards: RewardPool) -> list[RewardResult]:
    """The reward of every decoded sample (``gradings[i]`` is sample i's prompt's context)."""
    lengths = [len(s.token_ids) for per_request in result.samples for s in per_request]
    if not len(texts) == len(lengths) == len(gradings):
        raise ValueError(f"{len(lengths)} samples, {len(texts)} texts but {len(gradings)} answers")
    return rewards.score(list(texts), [g.answer for g in gradings], lengths,
                         sources=[g.source for g in gradings], extra_infos=[g.extra_info for g in gradings])  # fmt: skip


def decode_and_score(tokenizer: Any, result: GenerationResult, gradings: Sequence[Grading], rewards: RewardPool) -> tuple[list[str], list[RewardResult]]:
    """The texts and the rewards of every sample, in request order then sample order."""
    texts = decode_samples(tokenizer, result)
    return texts, score_texts(texts, result, gradings, rewards)


def reward_metrics(extras: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """``reward/<key>``: the mean of each extra value a custom reward function returned (each
    sample's :attr:`RewardResult.metrics`), over the samples that returned it."""
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for metrics in extras:
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + value
            counts[key] = counts.get(key, 0) + 1
    return {f"reward/{k}": sums[k] / counts[k] for k in sorted(sums)}
