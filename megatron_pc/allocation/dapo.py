"""DAPO dynamic sampling: draw batches of prompts, drop groups whose rewards are all equal,
keep drawing until train_batch groups survive. Survivors beyond the batch are discarded
(as in the reference), but their rollouts were generated and are counted."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Sequence

from megatron_pc.allocation.base import AllocationStrategy, full_requests
from megatron_pc.allocation.config import AllocationConfig
from megatron_pc.allocation.types import Request, Rollout, RoundPlan, TrainGroup
from megatron_pc.errors import ConfigError, RoundLimitError


class DAPO(AllocationStrategy):
    """Rounds of dapo_batch prompts x n rollouts; zero-variance groups are never trained."""

    name = "dapo"
    drops_uniform_groups = True

    @classmethod
    def check_pool(cls, cfg: AllocationConfig, pool_size: int) -> None:
        """One round draws ``dapo_batch`` distinct prompts."""
        if pool_size < cfg.rollouts_per_dapo_round:
            raise ConfigError("allocation.dapo_batch", f"the prompt pool has {pool_size} prompts, fewer than one DAPO round draws ({cfg.rollouts_per_dapo_round})")

    @classmethod
    def _rank_rules(cls, cfg: AllocationConfig, ranks: int) -> Iterator[tuple[str, str]]:
        """A round is dapo_batch prompts x n rollouts."""
        if (cfg.rollouts_per_dapo_round * cfg.n) % ranks:
            yield "dapo_batch", f"dapo_batch x n = {cfg.rollouts_per_dapo_round * cfg.n} rollouts must divide evenly over {ranks} generation engines"

    def _plan_requests(self) -> list[Request]:
        # A small pool may not hold a full round outside the groups already kept this step:
        # draw fewer, still split evenly over the generation engines.
        k = min(self.cfg.rollouts_per_dapo_round, self.pool.drawable - len(self.batch))
        while k > 0 and (k * self.cfg.n) % self.ranks:
            k -= 1
        if k <= 0:
            raise RoundLimitError(f"step {self.step}: no prompt of the pool is left outside this step's batch ({len(self.batch)} groups)")
        return full_requests(self._draw(k), self.cfg.n)

    def _observe(self, plan: RoundPlan, results: Sequence[Sequence[Rollout]]) -> None:
        for req, rollouts in zip(plan.requests, results):
            group = TrainGroup(req.prompt, list(rollouts), self.step)
            informative = group.informative
            kept = informative and len(self.batch) < self.cfg.train_batch
            if kept:
                self.batch.append(group)
            elif informative:
                self.acct.add("groups_surplus")
            else:
                self.acct.add("groups_filtered")
            self.trace.emit(
                {
                    "event": "full",
                    "step": plan.step,
                    "round": plan.round,
                    "prompt": req.prompt,
                    "n": req.n,
                    "successes": group.successes,
                    "kept": kept,
                    "reason": "kept" if kept else ("surplus" if informative else "zero_variance"),
                }
            )

    def _shortfall_hint(self) -> str:
        return "Too many groups had all-equal rewards: the data are too easy or too hard for the policy."
