"""Converters from public math datasets (as the user's own .parquet/.jsonl files) to our schema.

Assumed columns (others are ignored):

============  ============  ==============  ==============  ==========
format        prompt        answer          difficulty      id
============  ============  ==============  ==============  ==========
deepmath      question      final_answer    difficulty      (row index)
polaris       problem       answer          difficulty      (row index)
aime          problem       answer          --              id
math500       problem       answer          level           unique_id
============  ============  ==============  ==============  ==========

Answers are turned into strings (AIME answers are integers). A difficulty that is not a number
(Polaris writes pass rates like ``"7/8"``) is read as a fraction when it is one, else dropped.
Ids are ``<format>/<id column or row number>``.
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

from megatron_pc.data.records import PromptRecord, iter_rows, record_from_row
from megatron_pc.errors import DataError

__all__ = ["ColumnMap", "FORMATS", "convert_file"]


@dataclass(frozen=True)
class ColumnMap:
    """Which of a dataset's columns hold our fields (None: the dataset has no such column)."""

    prompt: str
    answer: str
    difficulty: str | None = None
    id: str | None = None


FORMATS: dict[str, ColumnMap] = {
    "deepmath": ColumnMap("question", "final_answer", difficulty="difficulty"),
    "polaris": ColumnMap("problem", "answer", difficulty="difficulty"),
    "aime": ColumnMap("problem", "answer", id="id"),
    "math500": ColumnMap("problem", "answer", difficulty="level", id="unique_id"),
}
"""Column maps by exact format name."""


def convert_file(path: str | Path, fmt: str) -> list[PromptRecord]:
    """Records in our schema from a .parquet or .jsonl file of dataset ``fmt`` (see FORMATS)."""
    if fmt not in FORMATS:
        raise DataError(f"unknown dataset format {fmt!r}; known: {sorted(FORMATS)}")
    cols = FORMATS[fmt]
    records: list[PromptRecord] = []
    seen: dict[str, str] = {}
    for n, (where, row) in enumerate(iter_rows(Path(path)), start=1):
        if not isinstance(row, dict):
            raise DataError(f"{where}: field '<row>': must be an object")
        for column in (cols.prompt, cols.answer):
            if column not in row:
                raise DataError(f"{where}: field {column!r}: missing (format {fmt} needs it)")
        answer = row[cols.answer]
        ours = {
            "id": f"{fmt}/{row.get(cols.id) if cols.id and row.get(cols.id) is not None else n}",
            "prompt": row[cols.prompt],
            "answer": answer if isinstance(answer, str) else str(answer),
            "source": fmt,
            "difficulty": _number(row.get(cols.difficulty)) if cols.difficulty else None,
        }
        record = record_from_row(ours, where)
        if record.id in seen:
            raise DataError(f"{where}: field 'id': duplicate id {record.id!r}, first at {seen[record.id]}")
        seen[record.id] = where
        records.append(record)
    return records


def _number(value: Any) -> float | None:
    """A difficulty as a float: numbers as they are, fraction strings parsed, else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(Fraction(str(value).strip()))
    except (ValueError, ZeroDivisionError):
        return None
