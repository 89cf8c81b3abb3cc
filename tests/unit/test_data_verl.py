"""verl-format parquet as a training and validation source: detection, ids, chat messages kept,
and each bad input refused with its file, row and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from verl_files import verl_row, write_verl

from megatron_pc.data import ChatMessage, DataConfig, PromptRecord, write_jsonl
from megatron_pc.data.convert import read_records
from megatron_pc.data.formats import detect_format
from megatron_pc.data.loading import load_prompt_sets
from megatron_pc.errors import ConfigError, DataError


def _train_file(path: Path, n: int = 6) -> Path:
    return write_verl(path, [verl_row(i, f"What is {i}+{i}?", str(2 * i), system="Box the answer.") for i in range(n)])


def test_verl_rows_keep_their_chat_messages_and_take_answer_id_and_source_from_the_nested_columns(tmp_path: Path) -> None:
    path = _train_file(tmp_path / "train.parquet", 2)
    assert detect_format(path).name == "verl"
    records = read_records(path)
    assert records[1] == PromptRecord(
        "deepmath/train/1",
        (ChatMessage("system", "Box the answer."), ChatMessage("user", "What is 1+1?")),
        "2",
        "deepmath",
    )


def test_a_missing_index_is_the_row_number_and_a_missing_split_is_left_out_of_the_id(tmp_path: Path) -> None:
    path = write_verl(tmp_path / "t.parquet", [verl_row(None, "q1", "1", split=None), verl_row(None, "q2", "2", split="test")])
    assert [r.id for r in read_records(path)] == ["deepmath/1", "deepmath/test/2"]


def test_numeric_ground_truths_are_read_as_their_text(tmp_path: Path) -> None:
    ints = write_verl(tmp_path / "i.parquet", [verl_row(0, "q", 204)], ground_truth=pa.int64())
    floats = write_verl(tmp_path / "f.parquet", [verl_row(0, "q", 3.0), verl_row(1, "r", 0.5)], ground_truth=pa.float64())
    assert [r.answer for r in read_records(ints)] == ["204"]
    assert [r.answer for r in read_records(floats)] == ["3", "0.5"]


def test_a_verl_file_is_a_training_source_and_verl_files_are_validation_sets(tmp_path: Path) -> None:
    train = _train_file(tmp_path / "train.parquet", 8)
    # The recipe's test files count their index from 0 too: the split keeps the ids apart.
    aime = write_verl(tmp_path / "aime-2024-nosystem-boxed.parquet", [verl_row(i, f"AIME {i}", str(i), "aime_2024", "test") for i in range(3)])
    # One test prompt repeats a training prompt: it must leave the training set.
    dup = write_verl(tmp_path / "deepmath_test.parquet", [verl_row(0, "What is 3+3?", "6", split="test", system="Box the answer.")])
    cfg = DataConfig(source=str(train), validation=[str(aime), {"path": str(dup), "name": "deepmath", "format": "verl"}])
    train_records, sets = load_prompt_sets(cfg, seed=0)
    assert list(sets) == ["aime-2024-nosystem-boxed", "deepmath"]
    assert [r.id for r in sets["aime-2024-nosystem-boxed"]] == ["aime_2024/test/0", "aime_2024/test/1", "aime_2024/test/2"]
    assert "deepmath/train/3" not in {r.id for r in train_records} and len(train_records) == 7


def test_data_format_names_the_format_and_an_unknown_one_is_a_config_error(tmp_path: Path) -> None:
    train = _train_file(tmp_path / "train.parquet", 8)
    train_records, _ = load_prompt_sets(DataConfig(source=str(train), format="verl", validation_size=2), seed=0)
    assert len(train_records) == 6
    with pytest.raises(DataError, match=r"format ours needs the columns answer, id, which the file lacks"):  # once, for the file
        load_prompt_sets(DataConfig(source=str(train), format="ours", validation_size=2), seed=0)
    with pytest.raises(ConfigError, match=r"format: unknown format 'verl2'; known: auto, ours, verl"):
        DataConfig(source=str(train), format="verl2")


def test_our_schema_files_are_still_detected_as_ours(tmp_path: Path) -> None:
    path = tmp_path / "ours.jsonl"
    write_jsonl([PromptRecord("a", "1+1=", "2"), PromptRecord("b", "2+2=", "4")], path)
    assert detect_format(path).name == "ours"
    path.write_text(json.dumps({"id": "a", "prompt": "1+1="}) + "\n")  # our schema with a field missing
    with pytest.raises(DataError, match=r"line 1: field 'answer'"):
        read_records(path)


def test_columns_that_fit_no_format_or_several_are_named(tmp_path: Path) -> None:
    odd = tmp_path / "odd.jsonl"
    odd.write_text(json.dumps({"question_text": "q", "solution": "s"}) + "\n")
    with pytest.raises(DataError, match=r"no known format has these columns \(question_text, solution\)"):
        detect_format(odd)
    both = tmp_path / "both.jsonl"
    both.write_text(json.dumps({"problem": "q", "answer": "1", "id": 3, "difficulty": 2}) + "\n")
    with pytest.raises(DataError, match=r"several formats \(polaris, aime\)"):
        detect_format(both)


def _rows_with(bad: dict[str, Any]) -> list[dict[str, Any]]:
    """Two good rows and a bad third one."""
    return [verl_row(0, "q0", "0"), verl_row(1, "q1", "1"), {**verl_row(2, "q2", "2"), **bad}]


BAD_INPUTS = [
    # (what, rows, schema overrides, field, words of the rule); the bad row is the third, except
    # where a column's type makes every row bad (then it is the first).
    ("list ground truth", [verl_row(0, "q0", ["0", "zero"]), verl_row(1, "q1", ["1"])],
     {"ground_truth": pa.list_(pa.string())}, "reward_model.ground_truth", "is a list (2 items)"),
    ("empty ground truth", _rows_with({"reward_model": {"style": "rule", "ground_truth": "  "}}), {}, "reward_model.ground_truth", "is empty"),
    ("null ground truth", _rows_with({"reward_model": {"style": "rule", "ground_truth": None}}), {}, "reward_model.ground_truth", "missing"),
    ("no reward_model", _rows_with({"reward_model": None}), {}, "reward_model", "must be a struct with a ground_truth"),
    ("prompt neither text nor messages", [{**verl_row(i, "q", "1"), "prompt": i} for i in range(3)],
     {"prompt": pa.int64()}, "prompt", "must be a string or a non-empty list of messages, got int"),
    ("empty message list", _rows_with({"prompt": []}), {}, "prompt", "got an empty list"),
    ("unknown role", _rows_with({"prompt": [{"role": "tool", "content": "x"}]}), {}, "prompt[0]", "unknown role 'tool'"),
    ("id given twice", [verl_row(0, "q0", "0"), verl_row(1, "q1", "1"), verl_row(1, "q2", "2")], {}, "id",
     "duplicate id 'deepmath/train/1', first at"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "rows", "types", "field", "rule"), BAD_INPUTS, ids=[b[0] for b in BAD_INPUTS])
def test_a_bad_verl_row_is_refused_naming_file_row_and_field(tmp_path: Path, what: str, rows: list[dict[str, Any]],
                                                             types: dict[str, Any], field: str, rule: str) -> None:  # fmt: skip
    path = write_verl(tmp_path / "bad.parquet", rows, **types)
    with pytest.raises(DataError) as err:
        read_records(path)
    message = str(err.value)
    row = 1 if types else 3
    assert message.startswith(f"{path}:row {row}: field {field!r}: "), message
    assert rule in message, message


def test_a_repeated_id_on_a_copied_row_says_it_is_a_copy_and_how_to_ask_for_samples(tmp_path: Path) -> None:
    path = write_verl(tmp_path / "aime.parquet", [verl_row(0, "AIME 1", "204", "aime_2024", "test")] * 2)
    with pytest.raises(DataError, match=r"row 2: field 'id': duplicate id 'aime_2024/test/0', first at .*row 1; the row is a copy .* n"):
        read_records(path)
