"""Plain types shared by the allocation strategies and the loop that drives them."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

RequestKind = Literal["pilot", "commit", "full"]


@dataclass(slots=True)
class Rollout:
    """One generated response, as the allocation logic sees it.

    ``correct`` drives the pilot's success rate; ``reward`` (which may be shaped, e.g. DAPO's
    overlong penalty) drives group variance. ``data`` is opaque here: the trainer stores its
    payload in it (megatron_pc.training.payload.RolloutPayload: token ids, log-probs). It must be
    JSON-serialisable, or have a ``to_json()``, so that buffered pilots survive a checkpoint;
    it comes back from one as that JSON.
    """

    reward: float
    correct: bool
    data: Any = None

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        data = self.data.to_json() if hasattr(self.data, "to_json") else self.data
        return {"reward": self.reward, "correct": self.correct, "data": data}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Rollout":
        """Inverse of :meth:`to_json`."""
        return cls(reward=obj["reward"], correct=obj["correct"], data=obj["data"])


@dataclass(frozen=True, slots=True)
class Request:
    """Generate ``n`` rollouts of prompt ``prompt`` (a pool index) for the given purpose."""

    prompt: int
    n: int
    kind: RequestKind


@dataclass
class RoundPlan:
    """One generation round: every request is served by a single generation call (binding)."""

    step: int
    round: int
    requests: list[Request]

    @property
    def total_rollouts(self) -> int:
        """Rollouts this round generates."""
        return sum(r.n for r in self.requests)

    def rollouts_of(self, kind: RequestKind) -> int:
        """Rollouts of one kind in this round."""
        return sum(r.n for r in self.requests if r.kind == kind)


@dataclass
class TrainGroup:
    """A group of rollouts of one prompt, trained on with one shared advantage baseline."""

    prompt: int
    rollouts: list[Rollout]
    step: int
    pilot_step: int | None = None
    """For Pilot-Commit groups: the step whose pilot produced the kept pilot rollouts."""
    n_pilot: int = 0
    """How many of ``rollouts`` (the first ones) are kept pilot rollouts."""

    @property
    def size(self) -> int:
        """Rollouts in the group."""
        return len(self.rollouts)

    @cached_property
    def successes(self) -> int:
        """Correct rollouts in the group."""
        return [r.correct for r in self.rollouts].count(True)

    @cached_property
    def informative(self) -> bool:
        """False when every reward is equal: such a group has zero advantage and no gradient."""
        rewards = [r.reward for r in self.rollouts]
        return max(rewards) != min(rewards)

    @cached_property
    def reward_sum(self) -> float:
        """Sum of the group's rewards."""
        return sum(r.reward for r in self.rollouts)

    @cached_property
    def reward_variance(self) -> float:
        """Population variance of the group's rewards (exactly 0 for an uninformative group)."""
        if not self.informative:
            return 0.0
        rewards = [r.reward for r in self.rollouts]
        mean = self.reward_sum / len(rewards)
        dev = [x - mean for x in rewards]
        return sum(map(operator.mul, dev, dev)) / len(rewards)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "prompt": self.prompt,
            "rollouts": [r.to_json() for r in self.rollouts],
            "step": self.step,
            "pilot_step": self.pilot_step,
            "n_pilot": self.n_pilot,
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "TrainGroup":
        """Inverse of :meth:`to_json`."""
        return cls(
            prompt=obj["prompt"],
            rollouts=[Rollout.from_json(r) for r in obj["rollouts"]],
            step=obj["step"],
            pilot_step=obj["pilot_step"],
            n_pilot=obj["n_pilot"],
        )


@dataclass
class StepResult:
    """What a finished step hands to the trainer: its groups and its accounting."""

    step: int
    groups: list[TrainGroup]
    metrics: dict[str, float] = field(default_factory=dict)
    partial: bool = False
