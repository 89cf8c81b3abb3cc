"""GRPO: every prompt of the batch gets n rollouts, every step; nothing is filtered."""

from __future__ import annotations

from typing import Sequence

from megatron_pc.allocation.base import AllocationStrategy, full_requests
from megatron_pc.allocation.types import Request, Rollout, RoundPlan, TrainGroup


class GRPO(AllocationStrategy):
    """One round per step: train_batch prompts x n rollouts, all trained on."""

    name = "grpo"
    trains_full_batch = True

    def _plan_requests(self) -> list[Request]:
        return full_requests(self._draw(self.cfg.train_batch), self.cfg.n)

    def _observe(self, plan: RoundPlan, results: Sequence[Sequence[Rollout]]) -> None:
        for req, rollouts in zip(plan.requests, results):
            group = TrainGroup(req.prompt, list(rollouts), self.step)
            self.batch.append(group)
            self.trace.emit(
                {"event": "full", "step": plan.step, "round": plan.round, "prompt": req.prompt, "n": req.n, "successes": group.successes, "kept": True}
            )
