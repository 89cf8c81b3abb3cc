"""The allocation trace: one JSON object per line for every decision the controller makes."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Protocol

from megatron_pc.jsonl import read_jsonl


class TraceSink(Protocol):
    """Where trace events go."""

    def emit(self, event: dict[str, Any]) -> None:
        """Record one event."""

    def flush(self) -> None:
        """Make recorded events durable."""


class NullTrace:
    """A sink that drops events (the default when no trace is asked for)."""

    def emit(self, event: dict[str, Any]) -> None:
        """Drop the event."""

    def flush(self) -> None:
        """Nothing to flush."""


class ListTrace:
    """Keeps events in memory (tests, the simulator)."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []

    def emit(self, event: dict[str, Any]) -> None:
        """Keep the event."""
        self.events.append(event)

    def flush(self) -> None:
        """Nothing to flush."""


class TraceWriter:
    """Appends events to a JSONL file; events are buffered per step and flushed together.

    On resume, ``keep_through_step`` cuts the file back to the last checkpointed step, so a
    resumed run's trace equals an uninterrupted one.
    """

    def __init__(self, path: str | Path, keep_through_step: int | None = None) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if keep_through_step is not None and self.path.exists():
            self._truncate(keep_through_step)
        elif keep_through_step is None and self.path.exists():
            self.path.unlink()
        self._pending: list[str] = []

    def _truncate(self, last_step: int) -> None:
        kept = []
        for line in self.path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                break  # a torn last line from a crash: drop it and everything after
            if event.get("step", 0) > last_step:
                break
            kept.append(line)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in kept))
        os.replace(tmp, self.path)

    def emit(self, event: dict[str, Any]) -> None:
        """Queue one event."""
        self._pending.append(json.dumps(event, separators=(",", ":")))

    def flush(self) -> None:
        """Append queued events to the file."""
        if not self._pending:
            return
        with self.path.open("a") as f:
            f.write("".join(line + "\n" for line in self._pending))
        self._pending = []


def read_trace(path: str | Path) -> list[dict[str, Any]]:
    """All events of a trace file (or of its kept copy, trace.jsonl.gz: megatron_pc.jsonl)."""
    return read_jsonl(path)
