"""The prompt pool: stable prompt ids, a seeded order per epoch, and each prompt's state."""

from __future__ import annotations

import random
from typing import Any

from megatron_pc.allocation.rng import rng_from_json, rng_to_json

ACTIVE, DEFERRED, EVICTED = "active", "deferred", "evicted"


class PromptPool:
    """Prompts ``0 .. size-1`` (indices into the dataset) and where each one stands.

    Every prompt is in exactly one state: ``active``; ``deferred`` (piloted too hard this
    epoch: it comes back at the next epoch); ``evicted`` (solved every time: never drawn
    again). Each epoch draws the non-evicted prompts once, in a seeded random order.
    """

    def __init__(self, size: int, seed: int) -> None:
        if size < 1:
            raise ValueError(f"a prompt pool needs at least one prompt, got {size}")
        self.size = size
        self.epoch = 0
        self._rng = random.Random(seed)
        self._deferred: set[int] = set()
        self._evicted: set[int] = set()
        self._order: list[int] = []
        self._cursor = 0
        self._shuffle()

    def _shuffle(self) -> None:
        self._order = [i for i in range(self.size) if i not in self._evicted]
        self._rng.shuffle(self._order)
        self._cursor = 0

    @property
    def remaining(self) -> int:
        """Prompts not yet drawn this epoch."""
        return len(self._order) - self._cursor

    @property
    def drawable(self) -> int:
        """Prompts that an epoch draws (all but the evicted)."""
        return self.size - len(self._evicted)

    def draw(self, k: int, exclude: set[int] | frozenset[int] = frozenset()) -> list[int]:
        """The next ``k`` prompts of this epoch (fewer if the epoch runs out).

        Prompts in ``exclude`` (already in a batch that crosses an epoch boundary) are passed
        over and stay next in line.
        """
        if not exclude:
            out = self._order[self._cursor : self._cursor + k]
            self._cursor += len(out)
            return out
        out, passed = [], []
        i = self._cursor
        while i < len(self._order) and len(out) < k:
            (passed if self._order[i] in exclude else out).append(self._order[i])
            i += 1
        self._order[self._cursor : i] = out + passed
        self._cursor += len(out)
        return out

    def peek(self, k: int) -> list[int]:
        """The next ``k`` prompts this epoch would draw (fewer at its end), without drawing them."""
        return self._order[self._cursor : self._cursor + k]

    def undraw(self, k: int) -> None:
        """Put the last ``k`` drawn prompts back, in order (a round was trimmed)."""
        if k > self._cursor:
            raise ValueError(f"cannot put back {k} prompts, only {self._cursor} were drawn this epoch")
        self._cursor -= k

    def state(self, prompt: int) -> str:
        """The state of one prompt."""
        if prompt in self._evicted:
            return EVICTED
        return DEFERRED if prompt in self._deferred else ACTIVE

    def defer(self, prompt: int) -> None:
        """Too hard this epoch: it returns at the next one."""
        if prompt not in self._evicted:
            self._deferred.add(prompt)

    def evict(self, prompt: int) -> None:
        """Never draw this prompt again (from the next epoch on; this epoch drew it already)."""
        self._deferred.discard(prompt)
        self._evicted.add(prompt)

    def end_epoch(self) -> None:
        """Deferred prompts come back; a new order is drawn over the non-evicted prompts."""
        self._deferred.clear()
        self.epoch += 1
        self._shuffle()

    def counts(self) -> dict[str, int]:
        """How many prompts are in each state."""
        evicted, deferred = len(self._evicted), len(self._deferred)
        return {ACTIVE: self.size - evicted - deferred, DEFERRED: deferred, EVICTED: evicted}

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state; restoring it reproduces every future draw."""
        return {
            "size": self.size,
            "epoch": self.epoch,
            "order": self._order,
            "cursor": self._cursor,
            "deferred": sorted(self._deferred),
            "evicted": sorted(self._evicted),
            "rng": rng_to_json(self._rng),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        if state["size"] != self.size:
            raise ValueError(f"checkpoint pool has {state['size']} prompts, this dataset has {self.size}")
        self.epoch = state["epoch"]
        self._order = list(state["order"])
        self._cursor = state["cursor"]
        self._deferred = set(state["deferred"])
        self._evicted = set(state["evicted"])
        self._rng = rng_from_json(state["rng"])
