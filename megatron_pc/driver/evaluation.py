"""Rewarding samples, and validation accuracy (sampled and greedy) on each held-out set."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, replace
from typing import Any

from megatron_pc.driver.prepare import ValidationData
from megatron_pc.console import CONSOLE
from megatron_pc.config import Config
from megatron_pc.data.loading import DEFAULT_VALIDATION_NAME
from megatron_pc.reward.pool import RewardPool
from megatron_pc.rollout.base import GenerationRequest, GenerationResult, SamplingSettings, derive_seed

logger = logging.getLogger(__name__)


def decode_and_score(tokenizer: Any, result: GenerationResult, answers: list[str], rewards: RewardPool) -> list[tuple[float, bool]]:
    """(reward, correct) of every sample, in request order then sample order."""
    samples = [s for per_request in result.samples for s in per_request]
    if len(samples) != len(answers):
        raise ValueError(f"{len(samples)} samples but {len(answers)} answers")
    texts = tokenizer.batch_decode([s.token_ids for s in samples], skip_special_tokens=True)
    graded = rewards.score(texts, answers, [len(s.token_ids) for s in samples])
    return [(g.reward, g.correct) for g in graded]


@dataclass(frozen=True)
class SetPlan:
    """How one validation set is evaluated: its prompts and the sampled pass's settings."""

    name: str
    tokens: list[list[int]]
    answers: list[str]
    n: int
    sampling: SamplingSettings


@dataclass(frozen=True)
class SetScore:
    """Validation figures of one set."""

    accuracy: float
    """Mean correctness of the sampled responses."""
    accuracy_stderr: float
    """Standard error of ``accuracy`` over prompts (see :func:`prompt_stderr`)."""
    greedy_accuracy: float
    reward_mean: float
    """Mean reward of the sampled responses."""


def prompt_stderr(per_prompt: list[float]) -> float:
    """Standard error of the mean of per-prompt accuracies: sample std / sqrt(prompts).

    Taken over prompts rather than samples (sqrt(p(1-p)/samples)) because samples of one
    prompt are correlated; with one sample per prompt the two agree. NaN for one prompt.
    """
    if len(per_prompt) < 2:
        return math.nan
    mean = sum(per_prompt) / len(per_prompt)
    var = sum((x - mean) ** 2 for x in per_prompt) / (len(per_prompt) - 1)
    return math.sqrt(var / len(per_prompt))


def plan_sets(cfg: Config, data: Any) -> list[SetPlan]:
    """One plan per validation set of ``data`` (a RunData), sampling resolved against the run.

    With ``data.validation`` None or one file, the single set keeps the historical seed
    ``derive_seed(seed, "validation")``; sets of a list are seeded by their name too, so adding
    or reordering sets leaves each set's samples unchanged.
    """
    base = SamplingSettings.from_config(cfg.rollout)
    listed = {s.name: s for s in cfg.data.validation} if isinstance(cfg.data.validation, list) else {}
    sets = data.val_sets or [ValidationData(DEFAULT_VALIDATION_NAME, data.val, data.val_tokens)]
    plans = []
    for vs in sets:
        spec = listed.get(vs.name)
        n, temperature, top_p = (spec.n, spec.temperature, spec.top_p) if spec is not None else (None, None, None)
        sampling = replace(
            base,
            temperature=_or(temperature, base.temperature),
            top_p=_or(top_p, base.top_p),
            seed=derive_seed(cfg.seed, "validation", vs.name) if listed else derive_seed(cfg.seed, "validation"),
        )
        plans.append(SetPlan(vs.name, vs.tokens, [r.answer for r in vs.records], _or(n, cfg.training.val_samples), sampling))
    return plans


def _or(value: Any, default: Any) -> Any:
    return default if value is None else value


class Evaluator:
    """Validation on every set: ``n`` sampled responses per prompt (the set's n, temperature and
    top_p, defaulting to ``training.val_samples`` and the rollout's) with a fixed seed, so
    evaluations differ only by the policy, and one greedy response.

    Metrics: ``val_accuracy``, ``val_accuracy_stderr``, ``val_greedy_accuracy``,
    ``val_reward_mean``: the unweighted mean over the sets (the set's own values for one set);
    the stderr combines the sets' as independent: sqrt(sum se_i^2) / sets. When
    ``data.validation`` is a list, also ``val/<name>/accuracy``, ``.../accuracy_stderr``,
    ``.../greedy_accuracy``, ``.../reward_mean`` per set.
    """

    def __init__(self, cfg: Config, data: Any, engines: Any, rewards: RewardPool) -> None:
        self.cfg, self.data, self.engines, self.rewards = cfg, data, engines, rewards
        self.plans = plan_sets(cfg, data)
        self.per_set = isinstance(cfg.data.validation, list)

    def _generate(self, plan: SetPlan, n: int, sampling: SamplingSettings) -> list[list[tuple[float, bool]]]:
        """(reward, correct) of each sample, grouped by prompt."""
        out = self.engines.generate([GenerationRequest(tuple(t), n) for t in plan.tokens], sampling)
        answers = [a for a in plan.answers for _ in range(n)]
        scored = decode_and_score(self.data.tokenizer, out, answers, self.rewards)
        return [scored[i : i + n] for i in range(0, len(scored), n)]

    def score(self, plan: SetPlan) -> SetScore:
        """Sampled and greedy figures of one set under the current policy."""
        sampled = self._generate(plan, plan.n, plan.sampling)
        greedy = self._generate(plan, 1, replace(plan.sampling, temperature=0.0, seed=None))
        per_prompt = [sum(c for _, c in group) / len(group) for group in sampled]
        flat = [sample for group in sampled for sample in group]
        return SetScore(
            accuracy=sum(c for _, c in flat) / len(flat),
            accuracy_stderr=prompt_stderr(per_prompt),
            greedy_accuracy=sum(c for group in greedy for _, c in group) / len(greedy),
            reward_mean=sum(r for r, _ in flat) / len(flat),
        )

    def run(self, step: int) -> dict[str, float]:
        """Validation metrics of the current policy."""
        scores = {plan.name: self.score(plan) for plan in self.plans}
        metrics = summarize(scores, per_set=self.per_set)
        detail = "".join(f"; {name}: {s.accuracy:.3f} (greedy {s.greedy_accuracy:.3f})" for name, s in scores.items()) if self.per_set else ""
        logger.info(
            "step %d validation: sampled accuracy %.3f +- %.3f, greedy %.3f%s",
            step, metrics["val_accuracy"], metrics["val_accuracy_stderr"], metrics["val_greedy_accuracy"], detail,
            extra=CONSOLE,
        )
        return metrics


def summarize(scores: dict[str, SetScore], per_set: bool) -> dict[str, float]:
    """The metrics of :class:`Evaluator` from each set's score (in set order)."""
    metrics: dict[str, float] = {}
    if per_set:
        for name, s in scores.items():
            metrics |= {
                f"val/{name}/accuracy": s.accuracy, f"val/{name}/accuracy_stderr": s.accuracy_stderr,
                f"val/{name}/greedy_accuracy": s.greedy_accuracy, f"val/{name}/reward_mean": s.reward_mean,
            }
    k = len(scores)
    values = list(scores.values())
    metrics["val_accuracy"] = sum(s.accuracy for s in values) / k
    metrics["val_accuracy_stderr"] = math.sqrt(sum(s.accuracy_stderr**2 for s in values)) / k
    metrics["val_greedy_accuracy"] = sum(s.greedy_accuracy for s in values) / k
    metrics["val_reward_mean"] = sum(s.reward_mean for s in values) / k
    return metrics
