"""JSON round-trip of ``random.Random`` state, so checkpoints stay plain JSON."""

from __future__ import annotations

import random
from typing import Any


def rng_to_json(rng: random.Random) -> list[Any]:
    """The generator's full state as JSON-ready lists."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def rng_from_json(state: list[Any]) -> random.Random:
    """A generator in exactly the state :func:`rng_to_json` saved."""
    rng = random.Random()
    rng.setstate((state[0], tuple(state[1]), state[2]))
    return rng
