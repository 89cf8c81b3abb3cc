"""Per-step metrics: JSONL and TensorBoard in the run directory, W&B when asked, a progress bar.

One small interface (:class:`MetricsSink`; no sink at all drops everything): :func:`open_metrics`
builds the sinks a :class:`LoggingConfig` asks for. On resume, metrics written after the checkpoint
step are cut from metrics.jsonl so a resumed run's file equals an uninterrupted run's.
"""

from __future__ import annotations

import json
import logging
import math
import os
import secrets
import sys
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Protocol

from megatron_pc.console import CONSOLE
from megatron_pc.jsonl import read_jsonl
from megatron_pc.metrics.config import LoggingConfig

logger = logging.getLogger(__name__)

# The figures the progress bar shows, in order: (metric key, short label, format).
PROGRESS_FIELDS = (
    ("cum_generated", "rollouts", "{:,.0f}"),
    ("generated_pilot", "pilot", "{:,.0f}"),
    ("generated_commit", "commit", "{:,.0f}"),
    ("generated_full", "full", "{:,.0f}"),
    ("reward_mean", "reward", "{:.3f}"),
    ("zero_variance_share", "zero-var", "{:.2f}"),
    ("val_accuracy", "val", "{:.3f}"),
    ("time_total", "s/step", "{:.1f}"),
)


class MetricsSink(Protocol):
    """Receives one dict of scalar metrics per step."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Record the metrics of ``step``."""

    def close(self) -> None:
        """Flush and release resources."""


class JsonlMetrics:
    """Appends ``{"step": s, ...}`` lines to a file, flushed and fsynced every step."""

    def __init__(self, path: Path, resume_step: int | None) -> None:
        self.path = path
        cut_after(path, resume_step)
        self._file = path.open("a")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Write one line."""
        clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in metrics.items()}
        self._file.write(json.dumps({"step": step, **clean}, separators=(",", ":")) + "\n")
        self._file.flush()
        os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file."""
        self._file.close()


def cut_after(path: Path, resume_step: int | None) -> None:
    """Make the JSONL file ``path`` (rows with a ``step``) hold only the rows through
    ``resume_step``: none for a fresh run (None), and never a torn last line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        keep = [] if resume_step is None else _lines_through(path, resume_step)
        tmp = path.with_suffix(".tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        os.replace(tmp, path)


def _lines_through(path: Path, last_step: int) -> list[str]:
    kept = []
    for line in path.read_text().splitlines():
        try:
            step = json.loads(line)["step"]
        except (json.JSONDecodeError, KeyError, TypeError):
            break  # a torn line from a crash ends the usable part
        if step > last_step:
            break
        kept.append(line)
    return kept


class TensorBoardMetrics:
    """Scalars under the run directory's ``tensorboard/``."""

    def __init__(self, log_dir: Path, resume_step: int | None) -> None:
        from torch.utils.tensorboard import SummaryWriter  # torch is present wherever we train

        # purge_step drops events after the resume point from the previous attempt.
        self._writer = SummaryWriter(str(log_dir), purge_step=None if resume_step is None else resume_step + 1)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Add each finite scalar."""
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and math.isfinite(value):
                self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        """Close the writer."""
        self._writer.close()


WANDB_ID_FILE = "wandb_run_id"
"""The run directory's W&B run id: a resumed run continues the same W&B run."""


class WandbMetrics:
    """Logs each step's finite scalars to a Weights & Biases run (wandb must be installed).

    The W&B run id is made once and kept in the run directory (:data:`WANDB_ID_FILE`), so every
    attempt of a preempted or crashed run logs to the same W&B run (``resume="allow"``); an id
    made from the run name would merge two run directories of one experiment. W&B's own files go
    to ``$WANDB_DIR`` when set, else to the run directory; ``WANDB_MODE=offline`` keeps them local
    for ``wandb sync``. Steps logged before a crash and again after the resume keep W&B's first
    value (W&B refuses to go back in steps); metrics.jsonl holds the resumed values.
    """

    def __init__(self, project: str, run_name: str, run_dir: Path, config: dict[str, Any], naming: WandbNaming | None = None) -> None:
        try:
            import wandb
        except ImportError:
            raise ImportError(f"logging.wandb_project={project!r} needs the wandb package: pip install 'megatron-pc[wandb]'") from None
        self._wandb = wandb
        self.run_id = wandb_run_id(run_dir)
        where = None if os.environ.get("WANDB_DIR") else str(run_dir)
        naming = naming or WandbNaming(run_name)
        self._run = wandb.init(project=project, name=naming.name, id=self.run_id, resume="allow", dir=where, config=config,
                               entity=naming.entity, group=naming.group, tags=naming.tags)  # fmt: skip

    def log_table(self, step: int, key: str, rows: list[dict[str, Any]]) -> None:
        """Log ``rows`` (dicts with the same keys) as a W&B table under ``key`` at ``step``."""
        if not rows:
            return
        columns = list(rows[0])
        data = [[row.get(c) if isinstance(row.get(c), (int, float, str, bool, type(None))) else json.dumps(row.get(c)) for c in columns]
                for row in rows]  # fmt: skip
        # Mixed types: a validation row's sample is an index or "greedy", its extracted answer text or null.
        self._run.log({key: self._wandb.Table(columns=columns, data=data, allow_mixed_types=True)}, step=step)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Log the step's finite numbers (None and NaN are left out, as in TensorBoard; the step
        is W&B's own step, not a scalar)."""
        scalars = {k: v for k, v in metrics.items() if k != "step" and isinstance(v, (int, float)) and math.isfinite(v)}
        self._run.log(scalars, step=step)

    def close(self) -> None:
        """Finish the run (it stays resumable)."""
        self._run.finish()


@dataclass(frozen=True)
class WandbNaming:
    """A W&B run's name, entity, group and tags (see :func:`wandb_naming`)."""

    name: str
    entity: str | None = None
    group: str | None = None
    tags: list[str] | None = None


def wandb_naming(cfg: LoggingConfig, name: str, strategy: str, seed: int, model_path: str) -> WandbNaming:
    """``<name>-<strategy>-<seed>`` in group ``<name>``, tagged with the strategy and the model
    directory's name, unless ``logging.wandb_name`` / ``wandb_group`` / ``wandb_tags`` say otherwise."""
    model = Path(model_path).name or str(model_path)
    return WandbNaming(
        name=cfg.wandb_name or f"{name}-{strategy}-{seed}",
        entity=cfg.wandb_entity,
        group=cfg.wandb_group or name,
        tags=list(cfg.wandb_tags) if cfg.wandb_tags is not None else [strategy, model],
    )


def wandb_run_id(run_dir: Path) -> str:
    """The W&B run id kept in ``run_dir``, made (8 random lowercase hex digits) on first use."""
    path = run_dir / WANDB_ID_FILE
    if path.is_file():
        return path.read_text().strip()
    run_dir.mkdir(parents=True, exist_ok=True)
    run_id = secrets.token_hex(4)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(run_id + "\n")
    os.replace(tmp, path)  # a crash mid-write must not leave an empty id for the next attempt
    return run_id


class ProgressBar:
    """A tqdm bar over training steps whose postfix shows the key figures."""

    def __init__(self, total: int, initial: int) -> None:
        from tqdm import tqdm

        self._bar = tqdm(total=total, initial=initial, unit="step", file=sys.stderr, dynamic_ncols=True)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Advance to ``step`` and show its figures."""
        shown = {label: fmt.format(metrics[key]) for key, label, fmt in PROGRESS_FIELDS if key in metrics and metrics[key] is not None}
        self._bar.set_postfix(shown, refresh=False)
        self._bar.update(step - self._bar.n)

    def close(self) -> None:
        """Close the bar."""
        self._bar.close()


class MultiMetrics:
    """Fans each step out to several sinks."""

    def __init__(self, sinks: list[MetricsSink]) -> None:
        self.sinks = sinks

    @property
    def wandb(self) -> WandbMetrics | None:
        """The W&B sink, if W&B is on (for tables)."""
        return next((s for s in self.sinks if isinstance(s, WandbMetrics)), None)

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Log to every sink."""
        for sink in self.sinks:
            sink.log(step, metrics)

    def close(self) -> None:
        """Close every sink."""
        for sink in self.sinks:
            sink.close()


def open_metrics(
    cfg: LoggingConfig, run_dir: Path, run_name: str, total_steps: int, resume_step: int | None, config: dict[str, Any],
    naming: WandbNaming | None = None,
) -> MultiMetrics:
    """The sinks ``cfg`` asks for, resuming after ``resume_step`` when given (``naming``: the W&B
    run's name, group and tags; default: ``run_name`` alone)."""
    sinks: list[MetricsSink] = []
    if cfg.jsonl:
        sinks.append(JsonlMetrics(run_dir / "metrics.jsonl", resume_step))
    if cfg.tensorboard:
        sinks.append(TensorBoardMetrics(run_dir / "tensorboard", resume_step))
    if cfg.wandb_project:
        sinks.append(WandbMetrics(cfg.wandb_project, run_name, run_dir, config, naming))
    if cfg.progress:
        sinks.append(ProgressBar(total_steps, resume_step or 0))
    return MultiMetrics(sinks)


def report_peak_memory(peaks: dict[str, int], run_dir: Path) -> None:
    """Peak RSS of every process of a run (bytes, by name), in ``peak_memory.json`` and on the console."""
    (run_dir / "peak_memory.json").write_text(json.dumps(peaks, indent=1) + "\n")
    gib = {name: b / 2**30 for name, b in peaks.items()}
    logger.info("peak RSS: %s; total %.2f GiB", ", ".join(f"{n} {v:.2f} GiB" for n, v in gib.items()), sum(gib.values()), extra=CONSOLE)


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """All lines of a metrics.jsonl file (or of its kept copy, metrics.jsonl.gz: megatron_pc.jsonl)."""
    return read_jsonl(path)
