"""The grading worker process: receives (function, response, answer, data source, extra info),
sends back a Grade. ``function`` is a built-in grader's name or a custom spec (reward/custom.py).

Kept apart from pool.py so that the fork server can preload it (and sympy) once; workers forked
from it then start in milliseconds, which matters because a timed-out worker is killed and
replaced.
"""

from __future__ import annotations

import logging
import resource
import signal
from multiprocessing.connection import Connection

from typing import Any

from megatron_pc.reward.custom import call_custom, is_custom
from megatron_pc.reward.functions import REWARD_FUNCTIONS, Grade

# Preloaded here (see module docstring); the functions import it again, which is then free.
try:  # pragma: no branch - optional only for environments without the reward extra
    import math_verify  # noqa: F401
except ImportError:  # the pool still serves functions that do not need it
    pass


def worker_main(conn: Connection, memory_mb: int) -> None:
    """Serve grading requests until the parent sends None or closes the pipe."""
    # Ctrl-C goes to the whole process group; the parent decides what happens to workers.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # SLURM signals every process of a job on preemption (SIGTERM, or SIGUSR1 with --signal);
    # the driver must still grade the step in flight and checkpoint, so workers leave on the
    # parent's word (or when its pipe closes), never on their own.
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    if memory_mb > 0:
        limit = memory_mb * 1024 * 1024
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    # math-verify logs each failed parse at WARNING; hostile input would flood the driver's log.
    logging.getLogger("math_verify").setLevel(logging.ERROR)
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        conn.send(_grade(*request))


def _grade(name: str, response: str, answer: str, source: str, extra_info: dict[str, Any]) -> Grade:
    """Run one reward function; any exception (MemoryError, RecursionError, ...) is a wrong answer."""
    if is_custom(name):
        return call_custom(name, source, response, answer, extra_info)
    try:
        return REWARD_FUNCTIONS[name](response, answer)
    except BaseException as err:  # noqa: BLE001 - hostile input may raise anything
        return Grade(False, f"error:{type(err).__name__}", detail=str(err)[:200])
