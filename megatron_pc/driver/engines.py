"""The run's engines as the loop sees them: a dead engine is restarted and the call replayed.

An engine process can die in any call (generation, scoring, a weight push, sleep or wake).
The group marks it dead; :class:`RestartingEngines` then starts a fresh one in its place,
pushes the policy's current weights into it (a fresh engine loads the initial model from
disk) and makes the same call again. A round is replayed with the same requests and the same
sampling seed, and the strategy sees a round only once its generation returned, so nothing is
counted twice: the trace and the accounting are those of a run without the failure.

After ``rollout.engine_restarts`` restarts in a row without a call succeeding in between, the
run stops with an error that names the engine.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from megatron_pc.errors import MegatronPCError
from megatron_pc.rollout.base import EngineError, GenerationRequest, GenerationResult, SamplingSettings

logger = logging.getLogger(__name__)

T = TypeVar("T")


class RestartingEngines:
    """An :class:`~megatron_pc.rollout.group.EngineGroup` whose dead engines come back.

    ``restart(index)`` must start engine ``index`` anew and give it the policy's weights.
    """

    def __init__(self, group: Any, restart: Callable[[int], None], max_restarts: int) -> None:
        self.group = group
        self._restart = restart
        self.max_restarts = max_restarts
        self.restarts = 0
        """Engines restarted so far in this process (the loop reports it per step)."""
        self._in_a_row = 0

    def call(self, what: str, fn: Callable[[], T]) -> T:
        """``fn()``; when it fails because engines died, restart them and call it again."""
        while True:
            try:
                out = fn()
            except EngineError as err:
                dead = self.group.dead_engines()
                if not dead:
                    raise  # an engine refused the call but lives: not a fault a restart fixes
                names = ", ".join(self.group.engines[k].name for k in dead)
                if self._in_a_row >= self.max_restarts:
                    raise MegatronPCError(
                        f"rollout engine {names} died again during {what} after {self._in_a_row} restarts in a row "
                        f"(rollout.engine_restarts {self.max_restarts}); last error: {err.reason}"
                    ) from err
                self._in_a_row += 1
                logger.warning("rollout engine %s died during %s (%s): restarting it and replaying the call (%d of %d in a row)",
                               names, what, err.reason, self._in_a_row, self.max_restarts)  # fmt: skip
                for k in dead:
                    self._restart(k)
                    self.restarts += 1
                continue
            self._in_a_row = 0
            return out

    def generate(self, requests: Sequence[GenerationRequest], sampling: SamplingSettings) -> GenerationResult:
        """One round, replayed whole if an engine dies in it."""
        return self.call("generation", lambda: self.group.generate(requests, sampling))

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Engine log-probs of given sequences."""
        return self.call("scoring", lambda: self.group.score(sequences))

    def sleep(self) -> None:
        """Sleep while the policy trains (a no-op on CPU)."""
        self.call("sleep", self.group.sleep)

    def wake(self) -> None:
        """Wake before generating."""
        self.call("wake", self.group.wake)
