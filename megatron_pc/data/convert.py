"""Reading any known format (megatron_pc.data.formats) into our records, and writing them as .jsonl.

``read_records(path, fmt)`` is what training and validation sources go through: ``auto``
detects the format from the columns. ``convert_to_jsonl`` is ``megatron-pc data convert``:
it writes a temporary file next to the output and renames it only when every row was good,
so a bad row leaves nothing behind (and an older output untouched).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Iterator

from megatron_pc.data.formats import AUTO, FORMATS, ColumnMap, VerlFormat, resolve_format
from megatron_pc.data.records import PromptRecord, count_rows, iter_rows, write_jsonl
from megatron_pc.errors import DataError

__all__ = ["ColumnMap", "FORMATS", "PROGRESS_MIN_ROWS", "IdCheck", "convert_file", "convert_to_jsonl", "read_records"]

logger = logging.getLogger(__name__)

PROGRESS_MIN_ROWS = 5000
"""Files with at least this many rows get a progress bar when one is asked for."""


class IdCheck:
    """Remembers where each id was first seen, so a repeat names both places."""

    def __init__(self) -> None:
        self._seen: dict[str, tuple[str, PromptRecord]] = {}

    def problem(self, record: PromptRecord, where: str) -> str | None:
        """The error message if ``record.id`` was seen before, else None (and remember it)."""
        if record.id not in self._seen:
            self._seen[record.id] = (where, record)
            return None
        first, earlier = self._seen[record.id]
        message = f"{where}: field 'id': duplicate id {record.id!r}, first at {first}"
        if (earlier.prompt_key, earlier.answer) == (record.prompt_key, record.answer):
            # Evaluation files that repeat each problem once per sample (n_trials) look like this.
            message += ("; the row is a copy of that one (a file repeating each problem per sample?): "
                        "keep one copy and ask for the samples with the validation set's n")  # fmt: skip
        return message


def iter_records(path: str | Path, fmt: str = AUTO, progress: bool = False) -> Iterator[PromptRecord]:
    """Our records of ``path`` one by one; the first bad row or repeated id raises a DataError."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    form = resolve_format(path, fmt)
    ids = IdCheck()
    rows = iter_rows(path)
    if progress:
        rows = _with_bar(rows, path)
    for n, (where, row) in enumerate(rows, start=1):
        if not isinstance(row, dict):
            raise DataError(f"{where}: field '<row>': must be an object, got {type(row).__name__}")
        if n == 1 and isinstance(form, VerlFormat) and form.agent_fields(row):
            logger.warning("%s: has verl's agent columns (%s); they are ignored: each row is read as a single-turn prompt "
                           "and graded on its final answer, with no tools and no agent loop", path, ", ".join(form.agent_fields(row)))
        record = form.record(row, n, where)
        duplicate = ids.problem(record, where)
        if duplicate:
            raise DataError(duplicate)
        yield record


def read_records(path: str | Path, fmt: str = AUTO, progress: bool = False) -> list[PromptRecord]:
    """All records of a file in format ``fmt`` (``auto``: detected from its columns)."""
    records = list(iter_records(path, fmt, progress))
    if not records:
        raise DataError(f"{path}: no rows")
    return records


def convert_file(path: str | Path, fmt: str) -> list[PromptRecord]:
    """Records in our schema from a .parquet or .jsonl file of format ``fmt`` (see FORMATS)."""
    return read_records(path, fmt)


def convert_to_jsonl(path: str | Path, fmt: str, out: str | Path, progress: bool = True) -> int:
    """Write ``path`` (format ``fmt``) as our .jsonl at ``out``; returns the rows written.

    Every row is read and checked before ``out`` appears: on any error nothing is written.
    """
    out = Path(out)
    if out.suffix.lower() != ".jsonl":
        raise DataError(f"{out}: data convert writes our schema as JSON lines, so the output must be named .jsonl "
                        f"(got {out.suffix or 'no suffix'}); training reads that .jsonl as it is")  # fmt: skip
    records = read_records(path, fmt, progress)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Same directory as out, so the final rename stays on one filesystem (atomic).
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    os.close(fd)
    try:
        write_jsonl(records, tmp)
        # mkstemp makes the file 0600; the output gets the mode any new file would (0644 under umask 022),
        # so that teammates on shared storage can read it.
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return len(records)


def _umask() -> int:
    """The process's umask (read by setting it and putting it back)."""
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _with_bar(rows: Iterator[tuple[str, object]], path: Path) -> Iterator[tuple[str, object]]:
    """``rows`` behind a tqdm bar on stderr, shown for files of PROGRESS_MIN_ROWS rows or more."""
    from tqdm import tqdm

    total = count_rows(path)
    with tqdm(total=total, unit="row", desc=path.name, file=sys.stderr, disable=total < PROGRESS_MIN_ROWS) as bar:
        for item in rows:
            yield item
            bar.update(1)
