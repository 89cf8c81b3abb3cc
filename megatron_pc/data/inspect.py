"""What ``megatron-pc data inspect`` reports about a data file: format, rows, fields, examples,
answer types and every problem (row and field), read the way training will read it."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_pc.data.convert import IdCheck
from megatron_pc.data.formats import AUTO, Format, resolve_format
from megatron_pc.data.records import PromptRecord, iter_rows
from megatron_pc.errors import DataError

__all__ = ["Inspection", "inspect_file", "render"]


@dataclass
class Inspection:
    """The findings about one file."""

    path: Path
    format: str | None
    """The format read (detected for ``auto``); None when no format could be chosen."""
    rows: int = 0
    fields: list[tuple[str, str]] = field(default_factory=list)
    """(name, type) of each top-level field: parquet's schema, or the JSON types a .jsonl has."""
    examples: list[PromptRecord] = field(default_factory=list)
    answer_types: Counter[str] = field(default_factory=Counter)
    """How many rows hold their answer as each type, before it is turned into our string."""
    problems: list[str] = field(default_factory=list)
    """Every bad row or repeated id, each naming the file, the row and the field."""


def inspect_file(path: str | Path, fmt: str = AUTO, examples: int = 3) -> Inspection:
    """Read all of ``path`` in format ``fmt``, collecting problems instead of stopping at one."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    try:
        form: Format | None = resolve_format(path, fmt)
    except DataError as err:
        form = None
        problem = str(err)
    found = Inspection(path, form.name if form else None)
    if form is None:
        found.problems.append(problem)
    json_types: dict[str, set[str]] = {}
    ids = IdCheck()
    for n, (where, row) in enumerate(iter_rows(path), start=1):
        found.rows = n
        if not isinstance(row, dict):
            found.problems.append(f"{where}: field '<row>': must be an object, got {type(row).__name__}")
            continue
        for key, value in row.items():
            json_types.setdefault(key, set()).add(_json_type(value))
        if form is not None:
            _check_row(found, form, ids, row, n, where, examples)
    found.fields = _parquet_fields(path) if path.suffix.lower() == ".parquet" else [(k, " | ".join(sorted(t))) for k, t in json_types.items()]
    return found


def _check_row(found: Inspection, form: Format, ids: IdCheck, row: dict[str, Any], n: int, where: str, examples: int) -> None:
    """Count the row's answer type; keep it as an example, or note its problem."""
    found.answer_types[_json_type(form.raw_answer(row))] += 1
    try:
        record = form.record(row, n, where)
    except DataError as err:
        found.problems.append(str(err))
        return
    duplicate = ids.problem(record, where)
    if duplicate:
        found.problems.append(duplicate)
    elif len(found.examples) < examples:
        found.examples.append(record)


def _json_type(value: Any) -> str:
    """A value's type in JSON terms (``string``, ``integer``, ``list``, ``struct``, ``null``...)."""
    if value is None:
        return "null"
    for kind, name in ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "list"), (dict, "struct")):
        if isinstance(value, kind):
            return name
    return type(value).__name__


def _parquet_fields(path: Path) -> list[tuple[str, str]]:
    import pyarrow.parquet as pq  # iter_rows has already imported it

    return [(f.name, str(f.type)) for f in pq.read_schema(path)]


def render(found: Inspection) -> str:
    """The findings as the text ``data inspect`` prints."""
    lines = [
        f"file:    {found.path}",
        f"format:  {found.format or '(none)'}",
        f"rows:    {found.rows}",
        "fields:",
        *[f"  {name}: {kind}" for name, kind in found.fields],
    ]
    if found.answer_types:
        lines.append("answer types: " + ", ".join(f"{kind} {count}" for kind, count in found.answer_types.most_common()))
    lines.append(f"examples (as read, our schema): {len(found.examples)}")
    lines += [f"  {json.dumps(r.to_row(), ensure_ascii=False)}" for r in found.examples]
    lines.append(f"problems: {len(found.problems)}")
    lines += [f"  {p}" for p in found.problems]
    return "\n".join(lines)
