"""verl-format parquet files built with pyarrow for the tests: nested structs and chat lists,
typed the way verl's preprocessing scripts (pandas -> parquet) write them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

MESSAGES = pa.list_(pa.struct([("role", pa.string()), ("content", pa.string())]))


def verl_row(index: int | None, question: str, answer: Any, source: str = "deepmath", split: str | None = "train",
             system: str | None = None) -> dict[str, Any]:  # fmt: skip
    """One row: the question as chat messages (a system message first when given)."""
    prompt = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": question}]
    return {
        "data_source": source,
        "prompt": prompt,
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": answer},
        "extra_info": {"index": index, "split": split},
    }


def write_verl(path: Path, rows: list[dict[str, Any]], ground_truth: pa.DataType = pa.string(), prompt: pa.DataType = MESSAGES) -> Path:
    """Write ``rows`` with an explicit schema, so a bad column (a list ground truth, a numeric
    prompt) is stored as such and not coerced."""
    schema = pa.schema([
        ("data_source", pa.string()),
        ("prompt", prompt),
        ("ability", pa.string()),
        ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", ground_truth)])),
        ("extra_info", pa.struct([("index", pa.int64()), ("split", pa.string())])),
    ])  # fmt: skip
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)
    return path
