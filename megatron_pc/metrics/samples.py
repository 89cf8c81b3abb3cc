"""What the model said: ``logging.samples`` rollouts a step in the run directory's samples.jsonl,
and, with W&B on, W&B tables of them and of each validation's answers.

Resume-safe as metrics.jsonl is: rows written after the checkpoint step are cut when a run
resumes, and the resumed steps write theirs again, so the file equals an uninterrupted run's.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from megatron_pc.metrics.logger import WandbMetrics, cut_after

__all__ = ["SAMPLE_FIELDS", "SampleLog"]

SAMPLE_FIELDS = ("step", "prompt_id", "prompt_index", "kind", "prompt", "response", "reward", "correct")
"""The fields of a samples.jsonl row, in order."""

TABLE_ROWS = 1000
"""At most this many rows go into one W&B table; the whole of each validation's answers is in
the run directory's validation/ files."""


class SampleLog:
    """Appends each step's sample rows to ``path``; also to W&B tables when ``wandb`` is given."""

    def __init__(self, path: Path, resume_step: int | None, wandb: WandbMetrics | None = None) -> None:
        self.path, self.wandb = path, wandb
        cut_after(path, resume_step)
        self._file = path.open("a")

    def write(self, step: int, rows: list[dict[str, Any]], validation: dict[str, list[dict[str, Any]]] | None = None) -> None:
        """The step's sample rows (and, for W&B, the answers of a validation run at this step, by set)."""
        for row in rows:
            self._file.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())
        if self.wandb is not None:
            if rows:
                self.wandb.log_table(step, "samples/rollouts", rows[:TABLE_ROWS])
            for name, answers in (validation or {}).items():
                self.wandb.log_table(step, f"samples/validation/{name}", answers[:TABLE_ROWS])

    def close(self) -> None:
        """Close the file."""
        self._file.close()
