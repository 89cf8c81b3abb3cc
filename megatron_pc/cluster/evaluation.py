"""Rewarding samples, and validation accuracy (sampled and greedy) on held-out prompts."""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import Any

from megatron_pc.config import Config
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


class Evaluator:
    """Validation: ``val_samples`` sampled responses per prompt at the rollout temperature with a
    fixed seed (so evaluations differ only by the policy), and one greedy response."""

    def __init__(self, cfg: Config, data: Any, engines: Any, rewards: RewardPool) -> None:
        self.cfg, self.data, self.engines, self.rewards = cfg, data, engines, rewards

    def _accuracy(self, n: int, sampling: SamplingSettings) -> tuple[float, float]:
        requests = [GenerationRequest(tuple(t), n) for t in self.data.val_tokens]
        out = self.engines.generate(requests, sampling)
        answers = [r.answer for r in self.data.val for _ in range(n)]
        scored = decode_and_score(self.data.tokenizer, out, answers, self.rewards)
        return sum(c for _, c in scored) / len(scored), sum(r for r, _ in scored) / len(scored)

    def run(self, step: int) -> dict[str, float]:
        """Validation metrics of the current policy."""
        base = SamplingSettings.from_config(self.cfg.rollout)
        sampled, reward = self._accuracy(self.cfg.training.val_samples, replace(base, seed=derive_seed(self.cfg.seed, "validation")))
        greedy, _ = self._accuracy(1, replace(base, temperature=0.0, seed=None))
        logger.info("step %d validation: sampled accuracy %.3f, greedy %.3f", step, sampled, greedy)
        return {"val_accuracy": sampled, "val_greedy_accuracy": greedy, "val_reward_mean": reward}
