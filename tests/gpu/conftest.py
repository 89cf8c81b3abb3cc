"""Fixtures of the GPU tests: a way to hand measured figures to scripts/gpu_smoke.sh."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import pytest

FIGURES_ENV = "MPC_GPU_FIGURES"
"""A JSON-lines file the GPU tests append their figures to (scripts/gpu_smoke.sh sets it)."""


def append_figure(test: str, values: dict[str, float | int | str]) -> None:
    """Append one ``{"test": ..., **values}`` line to $MPC_GPU_FIGURES; nothing when unset."""
    target = os.environ.get(FIGURES_ENV)
    if not target:
        return
    with Path(target).open("a", encoding="utf-8") as out:
        out.write(json.dumps({"test": test, **values}, sort_keys=True) + "\n")


@pytest.fixture
def record_figure(request: pytest.FixtureRequest) -> Callable[..., None]:
    """``record_figure(name=value, ...)``: the figures this test measured, for the smoke report."""

    def record(**values: float | int | str) -> None:
        append_figure(request.node.nodeid, values)

    return record
