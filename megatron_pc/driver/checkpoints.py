"""Run checkpoints: a directory per step, written aside and renamed into place when complete.

Layout under ``<run_dir>/checkpoints/``::

    step_00000010/
        policy/            Megatron distributed checkpoint (model, optimizer, scheduler, RNG)
        controller.json    allocation strategy + buffer, data cursor, driver RNG, counters
        MANIFEST.json      every file with its size and sha256

A checkpoint is valid only if MANIFEST.json exists and every file it lists has the listed
size and checksum. MANIFEST.json is written last, inside the temporary directory, before the
atomic rename: a crash at any point leaves either the previous checkpoint or a ``.tmp``
directory that is ignored and cleaned up.

The checksums are read back once per save and once per resume (the checkpoint resumed from);
pruning and the "previous checkpoint" of an error message check sizes only. Files are hashed
on a thread pool (hashlib releases the GIL), so a node's disk bandwidth, not one core, bounds
the time. Manifests written before checksums covered every file (sizes plus the controller's
hash) are still read.
"""

from __future__ import annotations

import errno
import hashlib
import json
import logging
import os
import re
import shutil
import signal
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from megatron_pc.errors import MegatronPCError

logger = logging.getLogger(__name__)

PREEMPTION_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
"""What SLURM sends before it preempts a job: the run checkpoints after its step and stops
(megatron_pc.driver.train.PREEMPTED_EXIT)."""


def on_preemption(handler: Callable[[int, Any], None]) -> None:
    """Let ``handler`` take the preemption signals (after ray.init, which installs its own SIGTERM handler)."""
    for sig in PREEMPTION_SIGNALS:
        signal.signal(sig, handler)


_STEP_DIR = re.compile(r"^step_(\d{8})$")
MANIFEST = "MANIFEST.json"
CONTROLLER = "controller.json"


class CheckpointManager:
    """Saves and finds complete run checkpoints."""

    def __init__(self, run_dir: str | Path, keep: int = 2, checksums: bool = True) -> None:
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.root = Path(run_dir) / "checkpoints"
        self.keep = keep
        self.checksums = checksums  # False: the manifest holds sizes only (training.checkpoint_checksums)

    def save(self, step: int, controller: dict[str, Any], write_policy: Callable[[Path], None]) -> Path:
        """Write checkpoint ``step``: ``write_policy(dir)`` fills ``dir/policy``; then rename."""
        self.root.mkdir(parents=True, exist_ok=True)
        final = self.root / f"step_{step:08d}"
        tmp = self.root / f"step_{step:08d}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            tmp.mkdir()
            write_policy(tmp / "policy")
            data = json.dumps(controller, separators=(",", ":")).encode()
            _write_synced(tmp / CONTROLLER, data)
            manifest = {"step": step, "files": _describe(tmp, self.checksums)}
            _write_synced(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
        except BaseException as err:
            free = _free_bytes(self.root)  # before the partial checkpoint goes: a full disk shows
            # Nothing half-written stays behind; the complete checkpoints are untouched.
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(err, Exception) and not isinstance(err, MegatronPCError):  # ours already say what happened
                raise CheckpointWriteError(step, self.root, err, free, self._newest_complete()) from err
            raise
        if final.exists():
            shutil.rmtree(final)  # a re-run of the same step after a resume replaces it
        os.replace(tmp, final)
        _fsync_dir(self.root)
        self._prune()
        logger.info("checkpoint saved: %s", final)
        return final

    def save_run(self, step: int, controller: dict[str, Any], policy: Any, written: Callable[[], None]) -> Path:
        """Checkpoint ``step`` of a run: the policy group (a PolicyGroup) saves into ``policy/``;
        ``written()`` runs between its files and the manifest (where the fault suite strikes)."""

        def write_policy(path: Path) -> None:
            policy.save(str(path))
            written()

        return self.save(step, controller, write_policy)

    def resume_point(self) -> tuple[int, Path | None, int | None]:
        """The step and directory of the newest complete checkpoint ((0, None) without one), and
        the last step its run's trace covers (None without one): a pipelined checkpoint also
        holds the next step, generated and traced before it was saved."""
        latest = self.latest()
        if latest is None:
            return 0, None, None
        step, path = latest
        pending = (self.load_controller(path).get("pipeline") or {}).get("pending")
        return step, path, step + (1 if pending else 0)

    def _newest_complete(self) -> Path | None:
        complete = sorted((s, p) for s, p in self._step_dirs() if verify(p, checksums=False) is None)
        return complete[-1][1] if complete else None

    def latest(self) -> tuple[int, Path] | None:
        """The newest complete checkpoint, skipping damaged ones (with a warning)."""
        for step, path in sorted(self._step_dirs(), reverse=True):
            problem = verify(path)
            if problem is None:
                return step, path
            logger.warning("skipping damaged checkpoint %s: %s", path, problem)
        return None

    def load_controller(self, path: Path) -> dict[str, Any]:
        """The controller state of a verified checkpoint."""
        return json.loads((path / CONTROLLER).read_text())

    def _step_dirs(self) -> list[tuple[int, Path]]:
        if not self.root.is_dir():
            return []
        out = []
        for p in self.root.iterdir():
            m = _STEP_DIR.match(p.name)
            if m and p.is_dir():
                out.append((int(m.group(1)), p))
        return out

    def _prune(self) -> None:
        for p in self.root.glob("*.tmp"):
            shutil.rmtree(p, ignore_errors=True)
        complete = sorted((s, p) for s, p in self._step_dirs() if verify(p, checksums=False) is None)
        for _, path in complete[: -self.keep]:
            shutil.rmtree(path, ignore_errors=True)


class CheckpointWriteError(MegatronPCError):
    """A checkpoint could not be written (disk full, file too large, no permission...)."""

    FULL_BELOW = 64 << 20
    """Free bytes under which a writer's failure is taken for a full disk: Megatron's
    checkpoint writer reports ENOSPC as its own error ("unexpected pos ...")."""

    def __init__(self, step: int, root: Path, err: Exception, free: int | None, previous: Path | None) -> None:
        cause = _os_error(err)
        if cause is not None and cause.errno == errno.ENOSPC:
            reason = "the disk is full"
        elif cause is not None:
            reason = cause.strerror or str(cause)
        elif free is not None and free < self.FULL_BELOW:
            reason = f"the disk is full (the writer said: {_last_line(err)})"
        else:
            reason = f"the checkpoint writer failed ({type(err).__name__}: {_last_line(err)})"
        where = f"{free / 2**30:.2f} GiB free there when it failed" if free is not None else "free space unknown"
        kept = f"the newest complete checkpoint, {previous}, is intact" if previous else "no earlier checkpoint exists"
        super().__init__(f"checkpoint of step {step} could not be written under {root}: {reason} ({where}); "
                         f"the partial checkpoint was removed and {kept}")  # fmt: skip


def _os_error(err: BaseException) -> OSError | None:
    """The OSError behind ``err``: itself, a Ray task error's cause, or its chain."""
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, OSError):
            return err
        nxt = getattr(err, "cause", None)  # a rank's error arrives wrapped in Ray's task error
        err = nxt if isinstance(nxt, BaseException) else (err.__cause__ or err.__context__)
    return None


def _last_line(err: BaseException) -> str:
    lines = [line for line in str(err).splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else type(err).__name__


def _free_bytes(path: Path) -> int | None:
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def verify(path: Path, checksums: bool = True) -> str | None:
    """None if ``path`` is a complete checkpoint, else what is wrong with it. ``checksums=False``
    checks that every listed file is there with its size, without reading it."""
    manifest_path = path / MANIFEST
    if not manifest_path.is_file():
        return f"{MANIFEST} is missing (the save did not finish)"
    try:
        manifest = json.loads(manifest_path.read_text())
        files = {name: _entry(e, name, manifest) for name, e in manifest["files"].items()}
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, AttributeError, ValueError) as err:
        return f"{MANIFEST} is unreadable ({type(err).__name__}: {err})"
    # A damaged key still parses as JSON: the manifest must name the step its directory is.
    named = re.fullmatch(r"step_(\d+)", path.name)
    if named and manifest.get("step") != int(named.group(1)):
        return f"{MANIFEST} names step {manifest.get('step')!r}, its directory is step {int(named.group(1))}"
    for name, (size, _) in files.items():
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        if f.stat().st_size != size:
            return f"{name} has {f.stat().st_size} bytes, the manifest says {size}"
    if checksums:
        hashed = {name: digest for name, (_, digest) in files.items() if digest is not None}
        for name, actual in zip(hashed, _sha256_all([path / n for n in hashed])):
            if actual != hashed[name]:
                return f"{name} does not match its checksum (sha256 {actual[:12]}..., the manifest says {hashed[name][:12]}...)"
    return None


def _describe(root: Path, checksums: bool) -> dict[str, dict[str, Any]]:
    """Every file under ``root``: its size and sha256 (None without ``checksums``)."""
    files = [p for p in sorted(root.rglob("*")) if p.is_file()]
    hashes = _sha256_all(files) if checksums else [None] * len(files)
    return {str(p.relative_to(root)): {"size": p.stat().st_size, "sha256": h} for p, h in zip(files, hashes)}


def _entry(entry: Any, name: str, manifest: dict[str, Any]) -> tuple[int, str | None]:
    """(size, sha256) of one manifest entry; the older format gives a size (and, for the
    controller, a separate hash)."""
    if isinstance(entry, dict):
        if set(entry) != {"size", "sha256"}:
            raise ValueError(f"{name}: the entry's keys are {sorted(entry)}, not size and sha256")
        size, digest = entry["size"], entry["sha256"]
    else:
        size, digest = entry, manifest["controller_sha256"] if name == CONTROLLER else None
    if not isinstance(size, int) or not (digest is None or isinstance(digest, str)):
        raise ValueError(f"bad entry for {name}: {entry!r}")
    return size, digest


def _sha256_all(paths: list[Path]) -> list[str]:
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as pool:
        return list(pool.map(sha256_file, paths))


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in 4 MiB chunks (checkpoint shards and model weights can be large)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _write_synced(path: Path, data: bytes) -> None:
    with path.open("wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
