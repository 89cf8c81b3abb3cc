"""Our prompt schema and its readers (.jsonl, .parquet).

One record per prompt:

- ``id`` (str, non-empty, unique within a file)
- ``prompt`` (str, non-empty; or a non-empty list of chat messages
  ``{"role": "system" | "user" | "assistant", "content": str}``)
- ``answer`` (str): the reference final answer, checked by the reward function
- ``source`` (str, optional): where the prompt comes from (``gsm_symbolic``, ``deepmath``, ...)
- ``difficulty`` (number, optional): any scale; larger is harder
- any other field whose value is a number, a boolean or a string of at most 200 characters
  (and those of a nested ``extra_info`` object, as ``extra_info.<key>``) is kept in the record's
  ``metadata``, which ``allocation.history.metadata`` may name

Other values (lists, objects, long texts) are ignored. A bad row raises
:class:`~megatron_pc.errors.DataError` naming the file, the line (jsonl, 1-based) or row
(parquet, 1-based) and the field; a duplicate id names both lines. See docs/data.md.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Iterator

from megatron_pc.errors import DataError

__all__ = ["ChatMessage", "PromptRecord", "record_from_row", "read_prompts", "write_jsonl", "iter_rows", "columns", "count_rows"]

CHAT_ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class ChatMessage:
    """One chat message of a prompt."""

    role: str
    content: str


@dataclass(frozen=True)
class PromptRecord:
    """One prompt in our schema (see module docstring)."""

    id: str
    prompt: str | tuple[ChatMessage, ...]
    answer: str
    source: str | None = None
    difficulty: float | None = None
    metadata: tuple[tuple[str, str | float | bool], ...] = ()
    """The row's other scalar fields, by name (``extra_info.<key>`` for a field of a nested
    ``extra_info`` object), for ``allocation.history.metadata``; other values are ignored."""

    @property
    def prompt_key(self) -> str:
        """The prompt as one string, to detect identical prompts under different ids."""
        if isinstance(self.prompt, str):
            return self.prompt
        return json.dumps([[m.role, m.content] for m in self.prompt])

    def to_row(self) -> dict[str, Any]:
        """The record as a JSON-ready row of our schema (optional fields only when set)."""
        prompt: Any = self.prompt
        if not isinstance(prompt, str):
            prompt = [{"role": m.role, "content": m.content} for m in prompt]
        row: dict[str, Any] = {"id": self.id, "prompt": prompt, "answer": self.answer}
        if self.source is not None:
            row["source"] = self.source
        if self.difficulty is not None:
            row["difficulty"] = self.difficulty
        row.update(self.metadata)
        return row


def record_from_row(row: Any, where: str) -> PromptRecord:
    """Validate one row (a mapping) into a record; ``where`` is ``file:line N`` for errors."""

    def fail(field: str, rule: str) -> DataError:
        return DataError(f"{where}: field {field!r}: {rule}")

    if not isinstance(row, dict):
        raise fail("<row>", f"must be an object, got {type(row).__name__}")
    rid = row.get("id")
    if not isinstance(rid, str) or not rid:
        raise fail("id", f"must be a non-empty string, got {rid!r}")
    answer = row.get("answer")
    if not isinstance(answer, str):
        raise fail("answer", f"must be a string, got {type(answer).__name__}")
    source = row.get("source")
    if source is not None and not isinstance(source, str):
        raise fail("source", f"must be a string if present, got {type(source).__name__}")
    difficulty = row.get("difficulty")
    if difficulty is not None:
        if isinstance(difficulty, bool) or not isinstance(difficulty, (int, float)) or not math.isfinite(difficulty):
            raise fail("difficulty", f"must be a finite number if present, got {difficulty!r}")
        difficulty = float(difficulty)
    return PromptRecord(rid, _prompt(row.get("prompt"), fail), answer, source, difficulty, _metadata(row))


OWN_FIELDS = frozenset({"id", "prompt", "answer", "source", "difficulty"})


METADATA_MAX_CHARS = 200
"""Longer strings (a worked solution, a long note) are not labels: they are not kept as metadata."""


def _scalar(value: Any) -> bool:
    if isinstance(value, str):
        return len(value) <= METADATA_MAX_CHARS
    return isinstance(value, bool) or (isinstance(value, (int, float)) and math.isfinite(value))


def _metadata(row: dict[str, Any]) -> tuple[tuple[str, str | float | bool], ...]:
    """The row's other scalar fields, and those of a nested ``extra_info`` object as ``extra_info.<key>``."""
    out = [(k, v) for k, v in row.items() if k not in OWN_FIELDS and isinstance(k, str) and _scalar(v)]
    extra = row.get("extra_info")
    if isinstance(extra, dict):
        out += [(f"extra_info.{k}", v) for k, v in extra.items() if isinstance(k, str) and _scalar(v)]
    return tuple(out)


def _prompt(value: Any, fail: Any) -> str | tuple[ChatMessage, ...]:
    """A prompt string, or chat messages checked one by one."""
    if isinstance(value, str):
        if not value:
            raise fail("prompt", "must not be empty")
        return value
    if not isinstance(value, list) or not value:
        raise fail("prompt", f"must be a string or a non-empty list of messages, got {_kind(value)}")
    messages = []
    for k, msg in enumerate(value):
        if not isinstance(msg, dict):
            raise fail(f"prompt[{k}]", f"must be a message {{'role': one of {CHAT_ROLES}, 'content': str}}, got {msg!r}")
        if msg.get("role") not in CHAT_ROLES:
            raise fail(f"prompt[{k}]", f"unknown role {msg.get('role')!r}; known: {', '.join(CHAT_ROLES)}")
        if not isinstance(msg.get("content"), str):
            raise fail(f"prompt[{k}]", f"'content' must be a string, got {_kind(msg.get('content'))}")
        messages.append(ChatMessage(msg["role"], msg["content"]))
    return tuple(messages)


def _kind(value: Any) -> str:
    """A value's type for an error message; an empty list says so (it is the usual mistake)."""
    if isinstance(value, list) and not value:
        return "an empty list"
    return "nothing (missing)" if value is None else type(value).__name__


def iter_rows(path: Path) -> Iterator[tuple[str, Any]]:
    """(location, raw row) for each row of a .jsonl or .parquet file; location is ``file:line N``."""
    suffix = path.suffix.lower()
    if suffix == ".jsonl":
        yield from _jsonl_rows(path)
    elif suffix == ".parquet":
        yield from _parquet_rows(path)
    else:
        raise DataError(f"{path}: unsupported file type {suffix!r} (expected .jsonl or .parquet)")


def _jsonl_rows(path: Path) -> Iterator[tuple[str, Any]]:
    with path.open("rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise DataError(f"{path}:line {n}: field '<json>': not UTF-8 text (byte {err.start}: {raw[err.start:err.start + 1]!r})") from None
            if not line.strip():
                continue  # blank lines (a trailing newline) are not rows
            try:
                yield f"{path}:line {n}", json.loads(line)
            except json.JSONDecodeError as err:
                raise DataError(f"{path}:line {n}: field '<json>': not valid JSON ({err.msg})") from None


def _pyarrow_parquet(path: Path) -> Any:
    """pyarrow.parquet, imported only when a parquet file is read."""
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(f"reading {path} needs the 'pyarrow' package (pip install pyarrow)") from None
    return pq


def _parquet_file(path: Path) -> Any:
    """An open ``pyarrow.parquet.ParquetFile``; a damaged file is a DataError naming it."""
    pq = _pyarrow_parquet(path)
    try:
        return pq.ParquetFile(path)
    except Exception as err:  # pyarrow raises ArrowInvalid / OSError subclasses for damaged files
        raise DataError(f"{path}: not a readable parquet file ({type(err).__name__}: {err})") from None


def _parquet_rows(path: Path) -> Iterator[tuple[str, Any]]:
    # Batch by batch: a 100k-row file with long solutions need not sit in memory as Python rows.
    n = 0
    parquet = _parquet_file(path)
    try:
        for batch in parquet.iter_batches(batch_size=1024):
            for row in batch.to_pylist():
                n += 1
                yield f"{path}:row {n}", row
    except Exception as err:  # a damaged column chunk surfaces only when it is decoded
        raise DataError(f"{path}:row {n + 1}: not a readable parquet file ({type(err).__name__}: {err})") from None


def columns(path: str | Path) -> list[str]:
    """The column names of a .parquet file, or the keys of a .jsonl file's first row."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    if path.suffix.lower() == ".parquet":
        return list(_parquet_file(path).schema_arrow.names)
    for _, row in iter_rows(path):
        return list(row) if isinstance(row, dict) else []
    return []


def count_rows(path: str | Path) -> int:
    """Rows of a .parquet file (from its footer) or non-blank lines of a .jsonl file."""
    path = Path(path)
    if path.suffix.lower() == ".parquet":
        return int(_parquet_file(path).metadata.num_rows)
    with path.open("rb") as f:
        return sum(1 for line in f if line.strip())


def read_prompts(path: str | Path) -> list[PromptRecord]:
    """All records of a .jsonl or .parquet file in our schema; duplicate ids are an error."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    records: list[PromptRecord] = []
    seen: dict[str, str] = {}
    for where, row in iter_rows(path):
        record = record_from_row(row, where)
        if record.id in seen:
            raise DataError(f"{where}: field 'id': duplicate id {record.id!r}, first at {seen[record.id]}")
        seen[record.id] = where
        records.append(record)
    if not records:
        raise DataError(f"{path}: no rows")
    return records


def write_jsonl(records: Iterable[PromptRecord], path: str | Path) -> None:
    """Write records as .jsonl in our schema."""
    with Path(path).open("w", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record.to_row(), ensure_ascii=False) + "\n")
