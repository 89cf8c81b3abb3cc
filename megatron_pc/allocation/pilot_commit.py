"""Pilot-Commit: pilot new prompts cheaply, commit the bulk of the rollouts to survivors.

Each round binds two kinds of work into one generation call: ``pilot.n`` rollouts for each
new prompt, and ``commit_n`` rollouts for each survivor taken from the replay buffer. A
pilot's success rate p_hat decides the prompt's fate: too easy (> p_upper) is skipped this
epoch, too hard (< p_lower) is deferred to the next epoch, in the band it waits in the
buffer for its commit; p_hat >= p_evict also evicts the prompt for good. A committed
survivor trains on its kept pilot rollouts plus its commit rollouts as one group.
See ../shared/docs/PILOT_COMMIT.md for the reference behaviour.
"""

from __future__ import annotations

from typing import Any, Sequence

from megatron_pc.allocation.base import AllocationStrategy
from megatron_pc.allocation.buffer import BufferEntry, ReplayBuffer, select_kept_pilots
from megatron_pc.allocation.types import Request, Rollout, RoundPlan, TrainGroup


class PilotCommit(AllocationStrategy):
    """The Pilot-Commit allocation strategy."""

    name = "pilot_commit"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.buffer = ReplayBuffer(self.cfg.buffer, seed=self._rng.randrange(2**31))
        self._committing: list[BufferEntry] = []

    # ---- planning ----------------------------------------------------------------------
    def _plan_requests(self) -> list[Request]:
        # A step that crosses an epoch boundary must not pilot (and so commit) a prompt that is
        # already in its batch: the new epoch draws every prompt again.
        in_batch = {g.prompt for g in self.batch}
        for attempt in range(2):
            # The second attempt: this epoch has nothing left to pilot but prompts of the batch.
            if self.pool.remaining == 0 or attempt == 1:
                self._end_epoch()
            pilots = self.pool.draw(self.cfg.pilot.batch, exclude=in_batch)
            wanted = min(self.cfg.train_batch - len(self.batch), len(self.buffer))
            n_pilots, n_commits = fit_round_to_ranks(len(pilots), self.cfg.pilot.n, wanted, self.cfg.commit_rollouts, self.ranks)
            # Pilots are trimmed only for the short last draw of an epoch (full pilot batches
            # divide evenly, validated): the trimmed ones are skipped this epoch, not lost.
            pilots = pilots[:n_pilots]
            if n_pilots or n_commits:
                break
        self.acct.add("prompts_drawn", n_pilots)
        self._committing = self.buffer.take(n_commits)
        self.acct.add("buffer_pops", len(self._committing))
        return [Request(p, self.cfg.pilot.n, "pilot") for p in pilots] + [
            Request(e.prompt, self.cfg.commit_rollouts, "commit") for e in self._committing
        ]

    # ---- observing ---------------------------------------------------------------------
    def _observe(self, plan: RoundPlan, results: Sequence[Sequence[Rollout]]) -> None:
        committing = iter(self._committing)
        self._committing = []
        for req, rollouts in zip(plan.requests, results):
            if req.kind == "pilot":
                self._classify_pilot(plan, req, list(rollouts))
            else:
                self._commit(plan, req, next(committing), list(rollouts))

    def _classify_pilot(self, plan: RoundPlan, req: Request, rollouts: list[Rollout]) -> None:
        cfg = self.cfg
        successes = [r.correct for r in rollouts].count(True)
        p_hat = successes / len(rollouts)
        self.acct.add("prompts_piloted")
        if p_hat > cfg.p_upper:
            decision = "too_easy"  # skipped: the epoch has drawn it already
        elif p_hat < cfg.p_lower:
            decision = "too_hard"
            self.pool.defer(req.prompt)
        else:
            decision = "keep"
            kept = select_kept_pilots(rollouts, cfg.pilot_kept, cfg.pilot.keep)
            self.acct.add("buffer_overflow", self.buffer.push(req.prompt, self.step, successes, len(rollouts), kept))
            self.acct.add("buffer_adds")
        self.acct.add(f"prompts_{decision}" if decision != "keep" else "prompts_kept")
        evict = p_hat >= cfg.p_evict
        if evict:
            self.pool.evict(req.prompt)
            self.acct.add("prompts_evicted")
        self.trace.emit(
            {
                "event": "pilot",
                "step": plan.step,
                "round": plan.round,
                "prompt": req.prompt,
                "n": req.n,
                "successes": successes,
                "decision": decision,
                "evict": evict,
            }
        )

    def _commit(self, plan: RoundPlan, req: Request, entry: BufferEntry, rollouts: list[Rollout]) -> None:
        group = TrainGroup(req.prompt, entry.kept + rollouts, self.step, pilot_step=entry.pilot_step, n_pilot=len(entry.kept))
        self.batch.append(group)
        self.trace.emit(
            {"event": "commit", "step": plan.step, "round": plan.round, "prompt": req.prompt, "n": req.n, "pilot_step": entry.pilot_step}
        )

    # ---- housekeeping ------------------------------------------------------------------
    def _end_step(self) -> int:
        # strict: nothing waiting may be older than max_age at the next step's commits; the
        # reference drops by this step's age, so one more step of age passes.
        dropped = self.buffer.drop_older_than(self.step + 1 if self.cfg.buffer.age_rule == "strict" else self.step)
        self.acct.add("buffer_age_evictions", dropped)
        return dropped

    def _on_epoch_end(self) -> None:
        self.acct.add("buffer_epoch_drops", self.buffer.clear())

    def _buffer_size(self) -> int:
        return len(self.buffer)

    def _extra_gauges(self, groups: list[TrainGroup]) -> dict[str, float]:
        ages = [g.step - g.pilot_step for g in groups if g.pilot_step is not None]
        return {"offpolicy_age_mean": sum(ages) / len(ages) if ages else 0.0, "offpolicy_age_max": max(ages, default=0)}

    def _shortfall_hint(self) -> str:
        return (
            f"Too few pilots land in the keep band [{self.cfg.p_lower}, {self.cfg.p_upper}]: the data are too hard "
            "or too easy for the policy, or the band is too narrow (allocation.p_lower / allocation.p_upper)."
        )

    def _extra_state(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict()}

    def _load_extra_state(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])


def fit_round_to_ranks(n_pilots: int, pilot_n: int, n_commits: int, commit_n: int, ranks: int) -> tuple[int, int]:
    """Largest (pilots, commits) <= the wanted ones whose rollouts divide evenly over ``ranks``.

    All pilots are kept when some number of commits evens the round out (always so for a full
    pilot batch, which is validated to divide evenly); otherwise pilots are trimmed too.
    """
    for p in range(n_pilots, -1, -1):
        for k in range(n_commits, -1, -1):
            if (p * pilot_n + k * commit_n) % ranks == 0:
                return p, k
    return 0, 0
