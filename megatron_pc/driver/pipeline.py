"""The state of pipelined training (``training.pipelined``, split placement).

While the policy trains step t, a thread runs step t+1's rounds on the engines, which still
hold the weights of step t-1; the weights are pushed when both are done. Every rollout is then
one step off-policy: the trace records the policy version behind each round (``generate``
events) and the metrics the lag and the age of the rollouts trained on (Pilot-Commit's kept
pilots are older by their buffer wait). A checkpoint holds the prefetched step
(:class:`Generated`), so a resumed run continues exactly.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from megatron_pc.allocation import StepResult, TrainGroup
from megatron_pc.console import CONSOLE

logger = logging.getLogger(__name__)


@dataclass
class Generated:
    """One step's generation: its train batch and what it cost (measured when it ran: during the
    step before, when pipelined)."""

    result: StepResult
    tokens: int
    responses: dict[str, float]
    seconds: dict[str, float]
    """Seconds of its phases (generate, reward)."""
    lag: int
    """Steps between the weights that generated it and the policy it trains: 0, or 1 pipelined."""
    calls: int
    """Engine calls made (one per round with binding, two for a round of new prompts and commits without)."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """The step's rows for samples.jsonl (``logging.samples``), written when the step is logged."""

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (rollout payloads included), for a pipelined checkpoint."""
        r = self.result
        return {"step": r.step, "groups": [g.to_json() for g in r.groups], "metrics": r.metrics, "partial": r.partial,
                "tokens": self.tokens, "responses": self.responses, "seconds": self.seconds, "lag": self.lag, "calls": self.calls,
                "samples": self.samples}  # fmt: skip

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Generated":
        """Inverse of :meth:`to_json`."""
        result = StepResult(obj["step"], [TrainGroup.from_json(g) for g in obj["groups"]], obj["metrics"], obj["partial"])
        return cls(result, obj["tokens"], obj["responses"], obj["seconds"], obj["lag"], obj["calls"], obj.get("samples", []))


@dataclass
class Versions:
    """Which policy version (the step whose update made the weights; 0: the start model) the
    engines hold, and which one generated each recent step's rollouts."""

    engines: int = 0
    by_step: dict[int, int] = field(default_factory=dict)

    def generated(self, step: int) -> None:
        """Step ``step``'s rounds run now, on the engines' weights."""
        self.by_step[step] = self.engines

    def ages(self, result: StepResult) -> list[int]:
        """Age in steps of every rollout trained at ``result.step``: the policy that takes the
        update (step - 1) minus the version that generated it."""
        now = result.step - 1
        out = []
        for g in result.groups:
            pilot = self.by_step.get(g.pilot_step, 0) if g.pilot_step is not None else None
            mine = self.by_step.get(result.step, now)
            out += [now - (pilot if pilot is not None and i < g.n_pilot else mine) for i in range(g.size)]
        return out

    def forget_before(self, step: int) -> None:
        """Drop the versions of steps no buffered pilot can come from any more."""
        self.by_step = {s: v for s, v in self.by_step.items() if s >= step}

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {"engines": self.engines, "by_step": {str(s): v for s, v in self.by_step.items()}}

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "Versions":
        """Inverse of :meth:`to_json`."""
        return cls(obj["engines"], {int(s): v for s, v in obj["by_step"].items()})


def pipeline_state(versions: Versions, pending: Generated | None) -> dict[str, Any]:
    """The ``pipeline`` entry of a run checkpoint's controller state."""
    return {"versions": versions.to_json(), "pending": pending.to_json() if pending is not None else None}


def resume_pipeline(controller: dict[str, Any], step: int) -> tuple[Versions, Generated | None]:
    """The versions and the prefetched step of a checkpoint saved at ``step`` (the engines get
    that step's weights on resume); a checkpoint without them holds none."""
    pipeline = controller.get("pipeline") or {}
    versions = Versions.from_json(pipeline["versions"]) if "versions" in pipeline else Versions(step)
    versions.engines = step
    return versions, Generated.from_json(pipeline["pending"]) if pipeline.get("pending") else None


def warn_uncorrected_lag(training: Any) -> None:
    """Pipelined without truncated importance sampling, nothing corrects the one step of lag."""
    if training.pipelined and training.tis_cap is None:
        logger.warning("training.pipelined: every rollout is one step off-policy and training.tis_cap is off, so nothing "
                       "corrects it; set training.tis_cap (e.g. 2.0) to weight tokens by min(pi_old / pi_engine, cap)", extra=CONSOLE)  # fmt: skip
