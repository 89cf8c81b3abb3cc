"""RewardPool: grade responses in worker processes with a hard per-item timeout.

Why processes and a pool of our own: math-verify's timeouts use ``signal.alarm`` (main thread
only), and some sympy evaluations sit in C code where no signal is delivered at all. The only
reliable bound is to kill the process. ``concurrent.futures.ProcessPoolExecutor`` cannot kill one
worker without breaking the whole pool, so each worker here is a process with its own pipe; one
that overruns ``timeout_s`` is killed and replaced, and its item gets reward 0.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import time
from collections import Counter, deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from typing import Any

from megatron_pc.reward.config import RewardConfig
from megatron_pc.reward.functions import Grade
from megatron_pc.reward.worker import worker_main

__all__ = ["RewardResult", "RewardPool", "overlong_penalty"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RewardResult:
    """Reward of one response: ``reward`` (the score, 0/1 for a built-in grader, plus any
    overlong penalty), ``correct`` (a success: score >= ``reward.success_threshold``), ``reason``
    (correct, incorrect, no_answer, answer_too_long, unparsable, too_long, timeout, worker_died,
    error:<Exception>, error:bad_return) and a custom function's extra ``metrics``."""

    reward: float
    correct: bool
    reason: str
    metrics: Mapping[str, float] = field(default_factory=dict)


def overlong_penalty(tokens: int, max_tokens: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment: 0 up to ``max_tokens - buffer`` tokens, then falling
    linearly to ``-factor`` at ``max_tokens``, and ``-factor`` beyond. ``buffer`` 0 disables it."""
    if buffer <= 0:
        return 0.0
    start = max_tokens - buffer
    if tokens <= start:
        return 0.0
    if tokens <= max_tokens:
        return (start - tokens) / buffer * factor
    return -factor


class _Worker:
    """One grading process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, memory_mb: int) -> None:
        self.conn, child = ctx.Pipe()
        self.process = ctx.Process(target=worker_main, args=(child, memory_mb), daemon=True)
        self.process.start()
        child.close()  # so that the parent sees EOF if the worker dies

    def kill(self) -> None:
        """Kill without asking: a worker stuck in C code does not read its pipe."""
        self.process.kill()
        self.process.join(timeout=5)
        self.conn.close()

    def stop(self) -> None:
        """Ask the worker to exit, kill it if it does not."""
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.process.join(timeout=1)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(timeout=5)
        self.conn.close()


class RewardPool:
    """Grades responses against reference answers with ``cfg.function`` in ``cfg.workers`` processes.

    ``max_tokens`` (the rollout length limit) is needed only for the overlong penalty.
    ``counters`` counts results by reason, plus ``scored`` and ``worker_restarts``. Custom
    functions are imported here first, so one that cannot load is refused before any grading.
    Use as a context manager, or call :meth:`close`.
    """

    def __init__(self, cfg: RewardConfig, max_tokens: int | None = None) -> None:
        if cfg.overlong_buffer > 0:
            if max_tokens is None:
                raise ValueError("reward.overlong_buffer > 0 needs max_tokens")
            cfg.check_max_tokens(max_tokens, "reward")
        cfg.check_functions()
        self.cfg = cfg
        self.max_tokens = max_tokens
        self.counters: Counter[str] = Counter()
        self._logged: set[tuple[str, str]] = set()  # (function, error reason) already named in the log
        self._ctx = _context()
        self._workers = [_Worker(self._ctx, cfg.worker_memory_mb) for _ in range(cfg.workers)]

    def __enter__(self) -> "RewardPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Stop all workers. Idempotent."""
        for worker in self._workers:
            worker.stop()
        self._workers = []

    def alive_workers(self) -> int:
        """Workers whose process is running (the pool's health, for tests and metrics)."""
        return sum(w.process.is_alive() for w in self._workers)

    def score(
        self, responses: list[str], answers: list[str], response_tokens: list[int] | None = None,
        sources: Sequence[str | None] | None = None, extra_infos: Sequence[dict[str, Any]] | None = None,
    ) -> list[RewardResult]:
        """Grade ``responses[i]`` against ``answers[i]``; never raises for bad model output.

        ``response_tokens[i]`` (token counts) enables the overlong penalty when configured.
        ``sources[i]`` (the prompt's data_source) picks the function (``reward.by_source``) and,
        with ``extra_infos[i]``, is passed to a custom one.
        """
        for what, given in (("answers", answers), ("token counts", response_tokens), ("sources", sources), ("extra_infos", extra_infos)):
            if given is not None and len(given) != len(responses):
                raise ValueError(f"{len(responses)} responses but {len(given)} {what}")
        requests = [(self.cfg.function_for(sources[i] if sources else None), responses[i], answers[i],
                     (sources[i] if sources else None) or "", dict(extra_infos[i]) if extra_infos else {})
                    for i in range(len(responses))]  # fmt: skip
        if not self._workers:
            raise RuntimeError("RewardPool is closed")
        grades: list[Grade | None] = [None] * len(responses)
        todo: deque[int] = deque()
        for i, response in enumerate(responses):
            # Oversized output never reaches a worker: even pickling 1 MB per item adds up.
            if len(response) > self.cfg.max_response_chars:
                grades[i] = Grade(False, "too_long")
            else:
                todo.append(i)
        self._run(todo, requests, grades)
        return [self._result(i, g, requests[i][0], response_tokens) for i, g in enumerate(grades)]

    def _result(self, i: int, grade: Grade | None, function: str, response_tokens: list[int] | None) -> RewardResult:
        """Turn a grade into a reward and count it; a failure (error, timeout, ...) is never a success."""
        assert grade is not None  # every index is graded by _run
        score = grade.score if grade.score is not None else (1.0 if grade.correct else 0.0)
        failed = grade.reason.startswith("error:") or grade.reason in ("timeout", "worker_died", "too_long")
        correct = not failed and score >= self.cfg.success_threshold
        reason = ("correct" if correct else "incorrect") if grade.score is not None else grade.reason
        self.counters["scored"] += 1
        self.counters[reason] += 1
        if reason.startswith("error:") and (function, reason) not in self._logged:
            self._logged.add((function, reason))
            logger.warning("reward function %s: %s%s; such responses are graded 0 and counted in reward_errors "
                           "(logged once)", function, reason, f" ({grade.detail})" if grade.detail else "")  # fmt: skip
        reward = score
        if response_tokens is not None and self.max_tokens is not None:
            reward += overlong_penalty(
                response_tokens[i], self.max_tokens, self.cfg.overlong_buffer, self.cfg.overlong_penalty
            )
        return RewardResult(reward, correct, reason, dict(grade.metrics))

    def _run(self, todo: deque[int], requests: list[tuple[Any, ...]], grades: list[Grade | None]) -> None:
        """Dispatch items to idle workers and collect results, killing those past their deadline."""
        busy: dict[int, tuple[int, float]] = {}  # worker slot -> (item, deadline)
        try:
            while todo or busy:
                for slot in range(len(self._workers)):
                    if slot not in busy and todo:
                        item = todo.popleft()
                        self._workers[slot].conn.send(requests[item])
                        busy[slot] = (item, time.monotonic() + self.cfg.timeout_s)
                next_deadline = min(deadline for _, deadline in busy.values())
                conns = [self._workers[slot].conn for slot in busy]
                ready = set(wait(conns, timeout=max(0.0, next_deadline - time.monotonic())))
                for slot in list(busy):
                    item, deadline = busy[slot]
                    grade = self._collect(slot, deadline, self._workers[slot].conn in ready)
                    if grade is not None:
                        grades[item] = grade
                        del busy[slot]
        except BaseException:
            # Interrupted mid-batch: busy workers hold stale requests, so replace them.
            for slot in busy:
                self._replace(slot)
            raise

    def _collect(self, slot: int, deadline: float, ready: bool) -> Grade | None:
        """The grade from worker ``slot`` if it is done or overdue, else None (still working)."""
        if ready:
            try:
                return self._workers[slot].conn.recv()
            except (EOFError, OSError):
                logger.warning("reward worker %d died while grading; replacing it", slot)
                self._replace(slot)
                return Grade(False, "worker_died")
        if time.monotonic() >= deadline:
            self._replace(slot)
            return Grade(False, "timeout")
        return None

    def _replace(self, slot: int) -> None:
        """Kill worker ``slot`` and start a fresh one in its place."""
        self._workers[slot].kill()
        self._workers[slot] = _Worker(self._ctx, self.cfg.worker_memory_mb)
        self.counters["worker_restarts"] += 1


def _context() -> Any:
    """A fork-server context with the worker module preloaded, else spawn.

    Not plain fork: the driver may hold threads, CUDA state or Ray sockets that a forked child
    must not inherit. Preloading makes replacement workers cheap (no sympy import per restart).
    """
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(["megatron_pc.reward.worker"])
        return ctx
    return mp.get_context("spawn")


def reward_faults(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    """What went wrong in the reward pool between two readings of its ``counters``: items that
    overran ``reward.timeout_s``, items whose worker died or raised (each graded 0), and the
    workers replaced."""

    def delta(reason: str) -> int:
        return after.get(reason, 0) - before.get(reason, 0)

    errors = sum(after[r] - before.get(r, 0) for r in after if r.startswith("error:"))
    return {"reward_timeouts": delta("timeout"), "reward_errors": delta("worker_died") + errors,
            "reward_worker_restarts": delta("worker_restarts")}  # fmt: skip
