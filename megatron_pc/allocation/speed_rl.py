"""SPEED-RL: screen each new prompt with a few rollouts, continue only those of intermediate pass rate.

Zhang, Arora, Mei, Zanette, "SPEED-RL: Faster Training of Reasoning Models via Online Curriculum
Learning" (arXiv 2506.09016; Zanette-Labs/speed-rl). For RLOO with N rollouts the signal-to-noise
ratio of a prompt's gradient is at most 4 N p (1 - p), so prompts that are always or never solved
waste their rollouts. SPEED spends ``n_init`` screening rollouts on every new prompt, accepts it
when ``p_low < pass rate < p_high`` (0 and 1: not all alike), and gives each accepted prompt the
other ``n - n_init`` rollouts of its group in the next inference call, together with the next
prompts' screening (its two phases share one call). Knobs: :class:`SpeedRLConfig`. The authors'
run scripts screen with 4 rollouts a prompt and continue with 20 (``rollout.n`` = 4 and
``rollout.n_continue`` = 20 in their 7B RLOO script): ``n_init`` = 4 is theirs, and the group
size follows the benchmark's shape (n = 64 there: 4 + 60).

In our loop, beside Pilot-Commit (docs/benchmarks.md):
* screening = a ``pilot`` request, continuation = a ``commit`` request; every rollout is counted;
* no keep band beyond "not all alike", no deferral and no eviction (a rejected prompt comes back
  next epoch), first-in first-out continuation, no age limit beyond the epoch;
* chosen by us: a round screens new prompts only when the accepted prompts waiting cannot fill
  the batch, and accepted prompts still waiting at an epoch's end are dropped (as Pilot-Commit's
  buffer), so a prompt drawn again by the next epoch is never waiting twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Sequence

from megatron_pc.allocation.base import AllocationStrategy
from megatron_pc.allocation.buffer import BufferEntry
from megatron_pc.allocation.config import AllocationConfig, commit_granularity
from megatron_pc.allocation.pilot_commit import fit_round_to_ranks
from megatron_pc.allocation.types import Request, Rollout, RoundPlan, TrainGroup
from megatron_pc.errors import ConfigError


def speed_decision(cfg: AllocationConfig, successes: int, n: int) -> str:
    """``keep`` (accepted), ``too_easy`` or ``too_hard`` for a screen of ``successes`` of ``n``."""
    p_hat = successes / n
    s = cfg.speed_rl
    return "too_easy" if p_hat >= s.p_high else "too_hard" if p_hat <= s.p_low else "keep"


class SpeedRL(AllocationStrategy):
    """Screening then continuation, bound in one call per round."""

    name = "speed_rl"

    @classmethod
    def rollouts_per_call(cls, cfg: AllocationConfig) -> int:
        """A continuation's rollouts: the call that completes a group draws only those."""
        return cfg.n - cfg.speed_rl.n_init

    @classmethod
    def screen_batch(cls, cfg: AllocationConfig) -> int:
        """New prompts screened per round."""
        return cfg.speed_rl.screen_batch if cfg.speed_rl.screen_batch is not None else cfg.pilot.batch

    @classmethod
    def pilot_decision(cls, cfg: AllocationConfig, successes: int, n: int) -> str:
        """What the trace checker expects of a screen."""
        return speed_decision(cfg, successes, n)

    @classmethod
    def max_commit_age(cls, cfg: AllocationConfig) -> int | None:
        """No age limit: an accepted prompt waits until it is continued, or its epoch ends."""
        return None

    @classmethod
    def check_config(cls, cfg: AllocationConfig, field_prefix: str = "") -> None:
        """A group is the screen plus its continuation (n in all); a continuation comes at least
        one round after its screen."""
        prefix = f"{field_prefix}." if field_prefix else ""
        if cfg.speed_rl.n_init >= cfg.n:
            raise ConfigError(f"{prefix}speed_rl.n_init", f"screening rollouts ({cfg.speed_rl.n_init}) must be < n ({cfg.n}) to leave a continuation")
        if cfg.max_rounds < 2:
            raise ConfigError(f"{prefix}max_rounds", "must be >= 2 for speed_rl: an accepted prompt is continued one round after its screen")

    @classmethod
    def _rank_rules(cls, cfg: AllocationConfig, ranks: int) -> Iterator[tuple[str, str]]:
        if (cls.screen_batch(cfg) * cfg.speed_rl.n_init) % ranks:
            yield "speed_rl.screen_batch", f"screen batch x n_init = {cls.screen_batch(cfg) * cfg.speed_rl.n_init} rollouts must divide evenly over {ranks} generation engines"
        step = commit_granularity(cls.rollouts_per_call(cfg), ranks)
        if cfg.train_batch % step:
            yield "train_batch", f"continuations come in multiples of {step} over {ranks} generation engines; train_batch ({cfg.train_batch}) must be one"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.accepted: list[BufferEntry] = []  # first in, first out
        self._continuing: list[BufferEntry] = []
        self._seq = 0

    def _plan_requests(self) -> list[Request]:
        need = self.cfg.train_batch - len(self.batch)
        n_init, cont = self.cfg.speed_rl.n_init, self.rollouts_per_call(self.cfg)
        in_batch = {g.prompt for g in self.batch} | {e.prompt for e in self.accepted}
        screens: list[int] = []
        if len(self.accepted) < need:
            for attempt in range(2):
                if self.pool.remaining == 0 or attempt == 1:
                    self._end_epoch()
                    in_batch = {g.prompt for g in self.batch}
                screens = self.pool.draw(self.screen_batch(self.cfg), exclude=in_batch)
                if screens:
                    break
        n_screens, n_cont = fit_round_to_ranks(len(screens), n_init, min(need, len(self.accepted)), cont, self.ranks)
        screens = screens[:n_screens]  # trimmed ones (an epoch's short last draw) are skipped this epoch, as Pilot-Commit's
        self.acct.add("prompts_drawn", n_screens)
        self._continuing, self.accepted = self.accepted[:n_cont], self.accepted[n_cont:]
        self.acct.add("buffer_pops", n_cont)
        return [Request(p, n_init, "pilot") for p in screens] + [Request(e.prompt, cont, "commit") for e in self._continuing]

    def _observe(self, plan: RoundPlan, results: Sequence[Sequence[Rollout]]) -> None:
        continuing = iter(self._continuing)
        for req, rollouts in zip(plan.requests, results):
            if req.kind == "pilot":
                self._screen(plan, req, list(rollouts))
            else:
                entry = next(continuing)
                self.batch.append(TrainGroup(req.prompt, entry.kept + list(rollouts), self.step, pilot_step=entry.pilot_step, n_pilot=len(entry.kept)))
                self.trace.emit({"event": "commit", "step": plan.step, "round": plan.round, "prompt": req.prompt, "n": req.n,
                                 "pilot_step": entry.pilot_step, "successes": [r.correct for r in rollouts].count(True)})  # fmt: skip
        self._continuing = []

    def _screen(self, plan: RoundPlan, req: Request, rollouts: list[Rollout]) -> None:
        successes = [r.correct for r in rollouts].count(True)
        decision = speed_decision(self.cfg, successes, len(rollouts))
        self.acct.add("prompts_piloted")
        self.acct.add("prompts_kept" if decision == "keep" else f"prompts_{decision}")
        if decision == "keep":
            self.accepted.append(BufferEntry(req.prompt, self.step, self._seq, successes, len(rollouts), rollouts))
            self._seq += 1
            self.acct.add("buffer_adds")
        self.trace.emit({"event": "pilot", "step": plan.step, "round": plan.round, "prompt": req.prompt, "n": req.n,
                         "successes": successes, "decision": decision, "evict": False})  # fmt: skip

    def _on_epoch_end(self) -> None:
        self.acct.add("buffer_epoch_drops", len(self.accepted))
        self.accepted = []

    def _buffer_size(self) -> int:
        return len(self.accepted)

    def _extra_gauges(self, groups: list[TrainGroup]) -> dict[str, float]:
        ages = [g.step - g.pilot_step for g in groups if g.pilot_step is not None]
        return {"offpolicy_age_mean": sum(ages) / len(ages) if ages else 0.0, "offpolicy_age_max": max(ages, default=0)}

    def _shortfall_hint(self) -> str:
        return "Too few screens were neither all right nor all wrong: the data are too hard or too easy for the policy."

    def _extra_state(self) -> dict[str, Any]:
        return {"accepted": [e.to_json() for e in self.accepted], "seq": self._seq}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.accepted = [BufferEntry.from_json(e) for e in state["accepted"]]
        self._seq = state["seq"]
