"""GRESO: skip, before any rollout, prompts whose reward history predicts a zero-variance group.

Zheng, Zhou, Bartoldson, Kailkhura, Lai, Zhao, Chen, "Act Only When It Pays: Efficient
Reinforcement Learning for LLM Reasoning via Selective Rollouts" (arXiv 2506.02177;
Infini-AI-Lab/GRESO). A prompt whose group was zero-variance at its last samplings tends to stay
so. GRESO keeps, per prompt, the streak of its latest samplings that were all right (easy) or all
wrong (hard); a drawn prompt with a streak of k is rolled out with probability
max(p^k, keep_floor) (p = p_easy or p_hard) and skipped otherwise, at no rollout cost. From the
second epoch on, after each step, each base probability moves by ``adjust_step`` towards the
value that makes that kind's share of the step's sampled groups meet its target (a third of
``target_zero_variance`` for easy groups, two thirds for hard ones). What is rolled out then goes
through DAPO's dynamic sampling: zero-variance groups are dropped, rounds repeat until the batch
is full. Knobs (the authors' released scripts): :class:`GresoConfig`.

Chosen by us: a round draws candidates until ``greso.batch`` of them pass the filter or the epoch
has none left to offer this round (the scripts filter a fixed draw and resample); a skipped
prompt counts as drawn, for no rollouts.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Sequence

from megatron_pc.allocation.base import full_requests
from megatron_pc.allocation.config import AllocationConfig
from megatron_pc.allocation.dapo import DAPO
from megatron_pc.allocation.types import Request, Rollout, RoundPlan
from megatron_pc.errors import ConfigError, RoundLimitError


def keep_probability(base: float, streak: int, floor: float) -> float:
    """Chance that a prompt with a zero-variance streak of ``streak`` samplings is rolled out."""
    return 1.0 if streak == 0 else max(base**streak, floor)


class GRESO(DAPO):
    """DAPO's dynamic sampling behind GRESO's probabilistic pre-rollout skipping."""

    name = "greso"

    @classmethod
    def check_pool(cls, cfg: AllocationConfig, pool_size: int) -> None:
        """One round rolls out ``greso.batch`` distinct prompts."""
        if pool_size < cfg.greso.round_prompts(cfg.train_batch):
            raise ConfigError("allocation.greso.batch", f"the prompt pool has {pool_size} prompts, fewer than one GRESO round rolls out "
                                                        f"({cfg.greso.round_prompts(cfg.train_batch)})")  # fmt: skip

    @classmethod
    def _rank_rules(cls, cfg: AllocationConfig, ranks: int) -> Iterator[tuple[str, str]]:
        k = cfg.greso.round_prompts(cfg.train_batch)
        if (k * cfg.n) % ranks:
            yield "greso.batch", f"greso batch x n = {k * cfg.n} rollouts must divide evenly over {ranks} generation engines"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.p_easy, self.p_hard = self.cfg.greso.p_easy, self.cfg.greso.p_hard
        self.streaks: dict[int, tuple[str, int]] = {}  # prompt -> ("easy" | "hard", streak length)
        self._sampled = {"easy": 0, "hard": 0, "all": 0}  # this step's rolled-out groups

    def _plan_requests(self) -> list[Request]:
        g = self.cfg.greso
        wanted = min(g.round_prompts(self.cfg.train_batch), self.pool.drawable - len(self.batch))
        chosen: list[int] = []
        judged: set[int] = set()  # this round's candidates: a round that crosses an epoch does not judge one twice
        # At most one epoch's worth of candidates per round, so a pool that is all skipped ends the round.
        while len(chosen) < wanted:
            candidates = self._draw_outside(wanted - len(chosen), judged)
            if not candidates:
                break
            judged.update(candidates)
            chosen += [p for p in candidates if self._passes(p)]
        seen = len(judged)
        while chosen and (len(chosen) * self.cfg.n) % self.ranks:
            chosen.pop()  # put out of this epoch, as a skipped prompt
        if not chosen:
            raise RoundLimitError(f"step {self.step}: GRESO skipped every prompt left in the pool outside this step's batch ({seen} judged "
                                  "this round): the pool is too small for its history")  # fmt: skip
        return full_requests(chosen, self.cfg.n)

    def _draw_outside(self, k: int, taken: set[int]) -> list[int]:
        """``k`` prompts (fewer when the pool has no more outside the batch and ``taken``)."""
        k = min(k, self.pool.drawable - len(self.batch) - len(taken))
        return self._draw(k, taken) if k > 0 else []

    def _passes(self, prompt: int) -> bool:
        """GRESO's skip decision (traced with what it rested on)."""
        kind, streak = self.streaks.get(prompt, ("easy", 0))
        if streak == 0:
            return True
        base = self.p_easy if kind == "easy" else self.p_hard
        keep = keep_probability(base, streak, self.cfg.greso.keep_floor)
        passed = self._rng.random() < keep
        if not passed:
            self.acct.add("prompts_skipped")
            self.acct.add(f"prompts_skipped_{kind}")
        self.trace.emit({"event": "skip_check", "step": self.step, "round": self.round, "prompt": prompt, "kind": kind, "streak": streak,
                         "base": base, "keep_probability": keep, "skipped": not passed})  # fmt: skip
        return passed

    def _observe(self, plan: RoundPlan, results: Sequence[Sequence[Rollout]]) -> None:
        super()._observe(plan, results)
        for req, rollouts in zip(plan.requests, results):
            successes = [r.correct for r in rollouts].count(True)
            kind = "easy" if successes == len(rollouts) else "hard" if successes == 0 else None
            self._sampled["all"] += 1
            if kind is None:
                self.streaks.pop(req.prompt, None)
                continue
            self._sampled[kind] += 1
            before_kind, before = self.streaks.get(req.prompt, (kind, 0))
            self.streaks[req.prompt] = (kind, before + 1 if before_kind == kind else 1)

    def _end_step(self) -> int:
        g = self.cfg.greso
        total = self._sampled["all"]
        if self.pool.epoch > 0 and total:
            for kind, target in (("easy", g.target_zero_variance / 3), ("hard", g.target_zero_variance * 2 / 3)):
                base = self.p_easy if kind == "easy" else self.p_hard
                share = self._sampled[kind] / total
                base = max(base - g.adjust_step, g.min_p) if share >= target else min(base + g.adjust_step, g.max_p)
                if kind == "easy":
                    self.p_easy = base
                else:
                    self.p_hard = base
        self._sampled = {"easy": 0, "hard": 0, "all": 0}
        return 0

    def _extra_gauges(self, groups: list[Any]) -> dict[str, float]:
        return {"greso_p_easy": self.p_easy, "greso_p_hard": self.p_hard, "greso_streaks": float(len(self.streaks))}

    def _extra_state(self) -> dict[str, Any]:
        return {"p_easy": self.p_easy, "p_hard": self.p_hard, "sampled": dict(self._sampled),
                "streaks": [[p, kind, n] for p, (kind, n) in sorted(self.streaks.items())]}  # fmt: skip

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.p_easy, self.p_hard = state["p_easy"], state["p_hard"]
        self._sampled = dict(state["sampled"])
        self.streaks = {int(p): (str(kind), int(n)) for p, kind, n in state["streaks"]}
