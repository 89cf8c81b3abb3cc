"""Fixtures of the GPU tests: a world of one rank, and a way to hand measured figures to
scripts/gpu_smoke.sh."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
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


@pytest.fixture(scope="module")
def world() -> Iterator[None]:
    """A one-rank process group (NCCL on GPU) with Megatron's groups at TP = PP = 1, for the
    tests of one module (each module gets its own and tears it down)."""
    import torch.distributed as dist

    from megatron_pc import platform
    from megatron_pc.training.launch import free_port
    from megatron_pc.training.parallel import destroy_parallel, init_parallel

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group(platform.dist_backend(), rank=0, world_size=1)
    init_parallel(1, 1)
    yield
    destroy_parallel()
    dist.destroy_process_group()
