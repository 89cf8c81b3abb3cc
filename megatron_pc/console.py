"""What a person sees while a run works: a progress bar and a few lines; everything else goes
to the run's train.log.

Libraries (vLLM, Megatron, Ray, Transformer Engine / Apex fallbacks, Python warnings) write to
file descriptors 1 and 2, from this process, its children and the Ray actors. A quiet run
points those descriptors at train.log and keeps the terminal for ``sys.stdout`` /
``sys.stderr`` of this process: our own prints, the progress bar, and log records marked for
the console (:func:`to_console`) or of level WARNING and above from megatron_pc itself. Ray
actors call :func:`redirect_worker_output` when they start, which sends their descriptors to
the same file (named by the environment variable :data:`LOG_FILE_ENV`), except the engines:
each engine process (and the vLLM workers it starts, which inherit its descriptors) writes to
a file of its own, ``logs/<engine>.log`` beside train.log, so that tens of engines do not all
append to one file on shared storage; train.log gets one line naming that file.
"""

from __future__ import annotations

import io
import logging
import os
import sys
from pathlib import Path
from typing import Any

LOG_FILE_ENV = "MEGATRON_PC_LOG_FILE"
"""Set for Ray actors of a quiet run: the file their output goes to."""
WORKER_LOG_DIR = "logs"
"""Beside train.log: the directory of the engines' own logs."""
CONSOLE = {"console": True}
"""``extra=`` of a log record that belongs on the console, e.g. a validation summary."""
_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def to_console(logger: logging.Logger, message: str, *args: Any) -> None:
    """Log ``message`` at INFO and show it on the console of a quiet run too."""
    logger.info(message, *args, extra=CONSOLE)


class _ConsoleFilter(logging.Filter):
    """Records marked for the console, and megatron_pc's own warnings and errors."""

    def filter(self, record: logging.LogRecord) -> bool:
        if getattr(record, "console", False):
            return True
        return record.levelno >= logging.WARNING and record.name.startswith("megatron_pc")


class _BarSafeHandler(logging.StreamHandler):
    """Writes through tqdm so that a line does not break the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            from tqdm import tqdm

            tqdm.write(self.format(record), file=self.stream)
        except Exception:  # noqa: BLE001 - logging must never raise
            self.handleError(record)


def setup(log_path: Path, verbose: bool) -> None:
    """Log everything to ``log_path``; unless ``verbose``, keep the terminal for the few lines above.

    Called once by ``megatron-pc train`` before any worker starts.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    root = logging.getLogger()
    for handler in list(root.handlers):  # the CLI's plain stderr handler: replaced below
        root.removeHandler(handler)
    root.setLevel(logging.INFO)
    logging.captureWarnings(True)
    file_handler = logging.FileHandler(log_path)
    file_handler.setFormatter(logging.Formatter(_FORMAT))
    root.addHandler(file_handler)
    if verbose:
        console = logging.StreamHandler(sys.stderr)
        console.setFormatter(logging.Formatter(_FORMAT, datefmt="%H:%M:%S"))
        root.addHandler(console)
        return
    _quiet_hugging_face_bars()
    sys.stdout.flush()
    sys.stderr.flush()
    # The terminal stays reachable through new descriptors; 1 and 2 now write to the log.
    terminal_out = io.TextIOWrapper(os.fdopen(os.dup(1), "wb", buffering=0), write_through=True, line_buffering=True)
    terminal_err = io.TextIOWrapper(os.fdopen(os.dup(2), "wb", buffering=0), write_through=True, line_buffering=True)
    _point_descriptors_at(log_path)
    sys.stdout, sys.stderr = terminal_out, terminal_err
    console = _BarSafeHandler(terminal_err)
    console.setFormatter(logging.Formatter("%(message)s"))
    console.addFilter(_ConsoleFilter())
    root.addHandler(console)
    os.environ[LOG_FILE_ENV] = str(log_path.resolve())


def route_library_logs(*names: str) -> None:
    """In a quiet run: send the stream handlers that libraries attached to their own loggers
    (Ray does at import, writing to the terminal) to the log instead."""
    path = os.environ.get(LOG_FILE_ENV)
    if not path:
        return
    for name in names:
        for handler in logging.getLogger(name).handlers:
            if isinstance(handler, logging.StreamHandler) and not isinstance(handler, logging.FileHandler):
                handler.setStream(open(path, "a", buffering=1))  # noqa: SIM115 - lives as long as the handler


def quiet() -> bool:
    """True in a quiet run (and in its Ray actors)."""
    return LOG_FILE_ENV in os.environ


def redirect_worker_output(own_log: str | None = None) -> Path | None:
    """In a Ray actor of a quiet run: send this process's output to the run's log, or, given
    ``own_log`` (an engine's name), to ``logs/<own_log>.log`` beside it (appended to by a
    restarted engine of the same name). Returns the file, None outside a quiet run."""
    path = os.environ.get(LOG_FILE_ENV)
    if not path:
        return None
    target = Path(path)
    if own_log is not None:
        target = target.parent / WORKER_LOG_DIR / f"{own_log}.log"
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(path, "a") as log:  # one line in train.log, not the engine's thousands
            log.write(f"{own_log} (pid {os.getpid()}) writes its output to {target}\n")
    sys.stdout.flush()
    sys.stderr.flush()
    _point_descriptors_at(target)
    return target


def _point_descriptors_at(path: Path) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


def _quiet_hugging_face_bars() -> None:
    """Switch off Hugging Face's progress bars ("Writing model shards", "Loading weights"): they
    write to ``sys.stderr``, which in a quiet run is the terminal, and would break our own bar.
    huggingface_hub reads the variable when imported (transformers takes it from there), so it holds
    for this process from now on and for every worker started after; modules already imported are
    told directly."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    if "huggingface_hub" in sys.modules:
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
