"""The file formats we read prompts from, by exact name, and their detection from the columns.

- ``ours``: our schema (``id``, ``prompt``, ``answer``[, ``source``, ``difficulty``]).
- ``verl``: the parquet files of verl and the reference recipe: ``prompt`` a list of chat
  messages, the answer in ``reward_model.ground_truth``, ``data_source``, and an
  ``extra_info`` struct (``index``, ``split``). See :class:`VerlFormat`.
- ``deepmath``, ``polaris``, ``aime``, ``math500``: public datasets' own columns
  (:class:`ColumnFormat`, one :class:`ColumnMap` each).

Every format turns one raw row into a :class:`PromptRecord` or raises a :class:`DataError`
that names the file, the row and the field. ``auto`` picks the one format whose identifying
columns the file has (:func:`detect_format`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, Protocol

from megatron_pc.data.records import PromptRecord, columns, record_from_row
from megatron_pc.errors import DataError

__all__ = ["AUTO", "ColumnMap", "FORMATS", "Format", "VerlFormat", "closest_formats", "detect_format", "resolve_format"]

AUTO = "auto"
"""The format setting that detects the format from the file's columns."""


class Format(Protocol):
    """How one file format's rows become our records."""

    name: str
    needs: frozenset[str]
    """Top-level columns that identify the format (all present: the format may be meant)."""
    required: frozenset[str]
    """Top-level columns without which no row of the file can be read in this format."""

    def record(self, row: dict[str, Any], n: int, where: str) -> PromptRecord:
        """Our record of raw row number ``n`` (1-based); ``where`` (``file:row N``) starts errors."""

    def raw_answer(self, row: dict[str, Any]) -> Any:
        """The answer as the file holds it (for ``data inspect``'s answer types)."""


def _fail(where: str, field: str, rule: str) -> DataError:
    return DataError(f"{where}: field {field!r}: {rule}")


@dataclass(frozen=True)
class OursFormat:
    """Our schema, read as it is."""

    name: str = "ours"
    needs: frozenset[str] = frozenset({"id", "prompt", "answer"})
    required: frozenset[str] = needs

    def record(self, row: dict[str, Any], n: int, where: str) -> PromptRecord:
        """The row validated as our schema."""
        return record_from_row(row, where)

    def raw_answer(self, row: dict[str, Any]) -> Any:
        """The ``answer`` field."""
        return row.get("answer")


@dataclass(frozen=True)
class VerlFormat:
    """verl's RL parquet layout (the reference recipe's files are written in it).

    The prompt's chat messages stay messages; the answer is ``reward_model.ground_truth``
    (a string, or a number written as one); the source is ``data_source``; the id is
    ``<data_source>/<extra_info.split>/<extra_info.index>`` with the split left out when
    absent and the 1-based row number standing in for a missing index. The split is part of
    the id because a recipe's train and test files both count their index from 0.
    ``extra_info.difficulty``, when a number, is the difficulty.
    """

    name: str = "verl"
    needs: frozenset[str] = frozenset({"prompt", "reward_model"})
    required: frozenset[str] = needs
    agent_columns: tuple[str, ...] = ("agent_name", "tools_kwargs", "interaction_kwargs")
    """Columns (top-level or in ``extra_info``) of verl's multi-turn agent datasets, which we read
    as single-turn prompts: the tools and the agent loop are not run."""

    def agent_fields(self, row: dict[str, Any]) -> list[str]:
        """The agent columns a row holds (``extra_info.tools_kwargs`` named so)."""
        extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
        return [c for c in self.agent_columns if c in row] + [f"extra_info.{c}" for c in self.agent_columns if c in extra]

    def record(self, row: dict[str, Any], n: int, where: str) -> PromptRecord:
        """Our record of a verl row; a ground truth that is a list, empty or missing is refused."""
        answer = _ground_truth(self.raw_answer(row), row.get("reward_model"), where)
        source = row.get("data_source")
        if source is not None and (not isinstance(source, str) or not source):
            raise _fail(where, "data_source", f"must be a non-empty string if present, got {source!r}")
        extra = row.get("extra_info")
        if extra is not None and not isinstance(extra, dict):
            raise _fail(where, "extra_info", f"must be a struct if present, got {type(extra).__name__}")
        extra = extra or {}
        index = extra.get("index")
        if index is not None and (isinstance(index, bool) or not isinstance(index, (int, str)) or index == ""):
            raise _fail(where, "extra_info.index", f"must be an integer or a non-empty string if present, got {index!r}")
        split = extra.get("split")
        parts = [source or self.name, *([split] if isinstance(split, str) and split else []), str(n if index is None else index)]
        difficulty = extra.get("difficulty")
        ours = {
            "id": "/".join(parts),
            "prompt": row.get("prompt"),
            "answer": answer,
            "source": source,
            "difficulty": difficulty if _finite(difficulty) else None,
            "extra_info": {k: v for k, v in extra.items() if k not in ("index", "split", "difficulty")},
        }
        return record_from_row(ours, where)

    def raw_answer(self, row: dict[str, Any]) -> Any:
        """``reward_model.ground_truth`` (None when either level is missing)."""
        reward_model = row.get("reward_model")
        return reward_model.get("ground_truth") if isinstance(reward_model, dict) else None


def _ground_truth(truth: Any, reward_model: Any, where: str) -> str:
    """The reference answer as a string; the reward checks exactly one answer per prompt."""
    field = "reward_model.ground_truth"
    if not isinstance(reward_model, dict):
        raise _fail(where, "reward_model", f"must be a struct with a ground_truth, got {'nothing (missing)' if reward_model is None else type(reward_model).__name__}")
    if truth is None:
        raise _fail(where, field, "missing: every prompt needs its reference answer")
    if isinstance(truth, (list, tuple)):
        raise _fail(where, field, f"is a list ({len(truth)} items); the reward checks one reference answer: keep one string")
    if isinstance(truth, bool) or not isinstance(truth, (str, int, float)):
        raise _fail(where, field, f"must be a string, got {type(truth).__name__}")
    text = truth if isinstance(truth, str) else _number_text(truth)
    if not text.strip():
        raise _fail(where, field, "is empty")
    return text


def _number_text(value: int | float) -> str:
    """A numeric answer as text; 3.0 is written 3, the way a model would answer it."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _finite(value: Any) -> bool:
    return not isinstance(value, bool) and isinstance(value, (int, float)) and math.isfinite(value)


@dataclass(frozen=True)
class ColumnMap:
    """Which of a dataset's columns hold our fields (None: the dataset has no such column)."""

    prompt: str
    answer: str
    difficulty: str | None = None
    id: str | None = None


@dataclass(frozen=True)
class ColumnFormat:
    """A public dataset's own columns, mapped by a :class:`ColumnMap`.

    Answers are turned into strings (AIME answers are integers). A difficulty that is not a
    number (Polaris writes pass rates like ``"7/8"``) is read as a fraction when it is one, else
    dropped. Ids are ``<format>/<id column or row number>``.
    """

    name: str
    cols: ColumnMap

    @property
    def needs(self) -> frozenset[str]:  # type: ignore[override]
        """Every column of the map."""
        return frozenset(c for c in (self.cols.prompt, self.cols.answer, self.cols.difficulty, self.cols.id) if c)

    @property
    def required(self) -> frozenset[str]:  # type: ignore[override]
        """The prompt and answer columns."""
        return frozenset({self.cols.prompt, self.cols.answer})

    def record(self, row: dict[str, Any], n: int, where: str) -> PromptRecord:
        """Our record of one dataset row."""
        cols = self.cols
        for column in (cols.prompt, cols.answer):
            if column not in row:
                raise _fail(where, column, f"missing (format {self.name} needs it)")
        answer = row[cols.answer]
        rid = row.get(cols.id) if cols.id else None
        ours = {
            "id": f"{self.name}/{n if rid is None else rid}",
            "prompt": row[cols.prompt],
            "answer": answer if isinstance(answer, str) else str(answer),
            "source": self.name,
            "difficulty": _fraction(row.get(cols.difficulty)) if cols.difficulty else None,
        }
        return record_from_row(ours, where)

    def raw_answer(self, row: dict[str, Any]) -> Any:
        """The answer column."""
        return row.get(self.cols.answer)


def _fraction(value: Any) -> float | None:
    """A difficulty as a float: numbers as they are, fraction strings parsed, else None."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return float(value)
    try:
        return float(Fraction(str(value).strip()))
    except (ValueError, ZeroDivisionError):
        return None


FORMATS: dict[str, Format] = {
    f.name: f
    for f in (
        OursFormat(),
        VerlFormat(),
        ColumnFormat("deepmath", ColumnMap("question", "final_answer", difficulty="difficulty")),
        ColumnFormat("polaris", ColumnMap("problem", "answer", difficulty="difficulty")),
        ColumnFormat("aime", ColumnMap("problem", "answer", id="id")),
        ColumnFormat("math500", ColumnMap("problem", "answer", difficulty="level", id="unique_id")),
    )
}
"""The formats by exact name."""


def detect_format(path: str | Path) -> Format:
    """The one format whose identifying columns ``path`` has (a .jsonl file: its first row's).

    None or several is a DataError that lists the formats, closest first, with the columns each
    lacks; except that a file lacking just one of our schema's fields is read as ours, so that the
    missing one is named with its row.
    """
    present = set(columns(path))
    if not present:
        raise DataError(f"{path}: no rows")
    matches = [f.name for f in FORMATS.values() if f.needs <= present]
    if len(matches) == 1:
        return FORMATS[matches[0]]
    if not matches and len(FORMATS["ours"].needs - present) == 1:
        # Most likely our schema with a field missing: its reader names the field and the row.
        return FORMATS["ours"]
    if not matches:
        raise DataError(f"{path}: no known format has these columns ({', '.join(sorted(present)) or 'none'}); "
                        f"the known formats, closest first: {closest_formats(present)}; name one with data.format (or --format) "
                        "once the columns are renamed, or convert the file (docs/data.md)")  # fmt: skip
    raise DataError(f"{path}: the columns fit several formats ({', '.join(matches)}); name one (data.format, or --format)")


def closest_formats(present: set[str]) -> str:
    """Every format with the columns it lacks, fewest lacking first (ties: most columns shared)."""
    ranked = sorted(FORMATS.values(), key=lambda f: (len(f.needs - present), -len(f.needs & present)))
    return "; ".join(f"{f.name} lacks {', '.join(sorted(f.needs - present))}" for f in ranked)


def resolve_format(path: str | Path, fmt: str) -> Format:
    """The format named ``fmt``, or the detected one for ``auto``. A named format whose required
    columns the file lacks is refused once for the file, not once per row."""
    if fmt == AUTO:
        return detect_format(path)
    if fmt not in FORMATS:
        raise DataError(f"unknown dataset format {fmt!r}; known: {', '.join([AUTO, *FORMATS])}")
    form = FORMATS[fmt]
    present = set(columns(path))
    lacking = form.required - present
    if present and lacking:
        raise DataError(f"{path}: format {fmt} needs the columns {', '.join(sorted(lacking))}, which the file lacks "
                        f"(its columns: {', '.join(sorted(present))}); the known formats, closest first: {closest_formats(present)}")
    return form
