"""Local multi-process runs (TP x PP x DP > 1) started by us: torch.multiprocessing spawn
with a free port on 127.0.0.1; the user never calls torchrun.

Each process runs ``fn(*args)`` after joining the process group; its return value comes
back through a file in a temporary directory (results of every rank, in rank order).
"""

from __future__ import annotations

import logging
import os
import socket
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.multiprocessing.spawn import ProcessException

from megatron_pc import platform

logger = logging.getLogger(__name__)


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(rank: int, world: int, port: int, out_dir: str, fn: Callable[..., Any], args: tuple) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(world), LOCAL_RANK=str(rank), OMP_NUM_THREADS="1")
    # Processes share few cores: one thread each avoids oversubscription.
    torch.set_num_threads(1)
    dist.init_process_group(platform.dist_backend(), rank=rank, world_size=world)
    try:
        result = fn(*args)
        torch.save(result, Path(out_dir) / f"{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_distributed(fn: Callable[..., Any], world_size: int, *args: Any, timeout_s: float = 600.0) -> list[Any]:
    """Run ``fn(*args)`` in ``world_size`` fresh processes; return each rank's result.

    ``fn`` must be importable (a module-level function). Raises RuntimeError if a process
    fails or the run exceeds ``timeout_s`` (then every process is terminated)."""
    with tempfile.TemporaryDirectory(prefix="mpc_dist_") as out_dir:
        ctx = mp.start_processes(_entry, args=(world_size, free_port(), out_dir, fn, args),
                                 nprocs=world_size, join=False, start_method="spawn")
        deadline = time.monotonic() + timeout_s
        try:
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"distributed run of {getattr(fn, '__name__', fn)!r} exceeded {timeout_s:.0f}s")
        except ProcessException as err:
            raise RuntimeError(f"a process of {getattr(fn, '__name__', fn)!r} failed:\n{err}") from None
        finally:
            for proc in ctx.processes:
                if proc.is_alive():
                    proc.terminate()
                    proc.join(5)
        return [torch.load(Path(out_dir) / f"{r}.pt", weights_only=False) for r in range(world_size)]
