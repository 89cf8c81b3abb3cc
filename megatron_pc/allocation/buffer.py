"""The replay buffer: pilot survivors waiting for their commit."""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

from megatron_pc.allocation.config import BufferConfig
from megatron_pc.allocation.rng import rng_from_json, rng_to_json
from megatron_pc.allocation.types import Rollout


@dataclass
class BufferEntry:
    """A prompt whose pilot landed in the keep band, with the pilot rollouts it keeps."""

    prompt: int
    pilot_step: int
    seq: int
    """Insertion counter: breaks ties between pilots of the same step (later is more recent)."""
    successes: int
    n_pilot: int
    kept: list[Rollout]

    @property
    def variance(self) -> float:
        """Bernoulli variance p(1-p) of the pilot success rate: the expected learning signal."""
        p = self.successes / self.n_pilot
        return p * (1.0 - p)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "prompt": self.prompt,
            "pilot_step": self.pilot_step,
            "seq": self.seq,
            "successes": self.successes,
            "n_pilot": self.n_pilot,
            "kept": [r.to_json() for r in self.kept],
        }

    @classmethod
    def from_json(cls, obj: dict[str, Any]) -> "BufferEntry":
        """Inverse of :meth:`to_json`."""
        return cls(
            prompt=obj["prompt"],
            pilot_step=obj["pilot_step"],
            seq=obj["seq"],
            successes=obj["successes"],
            n_pilot=obj["n_pilot"],
            kept=[Rollout.from_json(r) for r in obj["kept"]],
        )


class ReplayBuffer:
    """Survivors in insertion order; ``take`` chooses which ones a round commits."""

    def __init__(self, cfg: BufferConfig, seed: int) -> None:
        self.cfg = cfg
        self._entries: list[BufferEntry] = []
        self._seq = 0
        self._rng = random.Random(seed)

    def __len__(self) -> int:
        return len(self._entries)

    def entries(self) -> list[BufferEntry]:
        """A copy of the waiting entries, oldest first."""
        return list(self._entries)

    def push(self, prompt: int, pilot_step: int, successes: int, n_pilot: int, kept: list[Rollout]) -> int:
        """Add a survivor; returns how many of the oldest entries were dropped for capacity."""
        self._entries.append(BufferEntry(prompt, pilot_step, self._seq, successes, n_pilot, kept))
        self._seq += 1
        capacity = self.cfg.capacity
        overflow = 0 if capacity is None else max(0, len(self._entries) - capacity)
        if overflow:
            del self._entries[:overflow]  # entries are in insertion order: drop the oldest
        return overflow

    def take(self, k: int) -> list[BufferEntry]:
        """Remove and return up to ``k`` entries, chosen by the configured sampling."""
        k = min(k, len(self._entries))
        if k <= 0:
            return []
        if self.cfg.sampling == "random":
            chosen = sorted(self._rng.sample(range(len(self._entries)), k))
        else:
            # Highest pilot variance first; among equals the most recent pilot (freshest policy).
            ranked = sorted(
                range(len(self._entries)),
                key=lambda i: (-self._entries[i].variance, -self._entries[i].pilot_step, -self._entries[i].seq),
            )
            chosen = sorted(ranked[:k])
        picked = set(chosen)
        out = [self._entries[i] for i in chosen]
        self._entries = [e for i, e in enumerate(self._entries) if i not in picked]
        return out

    def drop_older_than(self, next_step: int) -> int:
        """Drop entries that would be older than ``max_age`` if committed at ``next_step``."""
        before = len(self._entries)
        self._entries = [e for e in self._entries if next_step - e.pilot_step <= self.cfg.max_age]
        return before - len(self._entries)

    def clear(self) -> int:
        """Drop everything (epoch end); returns how many entries were dropped."""
        dropped = len(self._entries)
        self._entries = []
        return dropped

    def state_dict(self) -> dict[str, Any]:
        """JSON-ready state, kept pilot rollouts included."""
        return {"entries": [e.to_json() for e in self._entries], "seq": self._seq, "rng": rng_to_json(self._rng)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict` output."""
        self._entries = [BufferEntry.from_json(e) for e in state["entries"]]
        self._seq = state["seq"]
        self._rng = rng_from_json(state["rng"])


def select_kept_pilots(rollouts: list[Rollout], keep: int, mode: str) -> list[Rollout]:
    """Choose ``keep`` of the pilot rollouts to enter the training group.

    ``max_variance`` keeps successes and failures as balanced as the pilot allows (the subset
    with the highest reward variance), taking the earliest of each; ``first`` keeps the first
    ``keep``. Order is preserved either way.
    """
    if keep >= len(rollouts):
        return list(rollouts)
    if mode == "first":
        return list(rollouts[:keep])
    wins = [i for i, r in enumerate(rollouts) if r.correct]
    losses = [i for i, r in enumerate(rollouts) if not r.correct]
    n_wins = min(max(keep // 2, keep - len(losses)), len(wins))
    chosen = sorted(wins[:n_wins] + losses[: keep - n_wins])
    return [rollouts[i] for i in chosen]
