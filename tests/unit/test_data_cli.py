"""`megatron-pc data inspect|convert` through the real command table: what inspect reports, what
convert writes, and every bad input refused with nothing written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from verl_files import verl_row, write_verl

from megatron_pc.cli import main
from megatron_pc.data.convert import PROGRESS_MIN_ROWS, read_records
from megatron_pc.data.records import read_prompts


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["data", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_inspect_reports_format_rows_fields_examples_and_answer_types(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_verl(tmp_path / "train.parquet", [verl_row(i, f"q{i}", str(i), system="Be brief.") for i in range(5)])
    code, out, _ = _run(capsys, "inspect", str(path))
    assert code == 0, out
    assert "format:  verl" in out and "rows:    5" in out
    assert "  prompt: list<element: struct<role: string, content: string>>" in out
    assert "  reward_model: struct<style: string, ground_truth: string>" in out
    assert "answer types: string 5" in out and "problems: 0" in out
    examples = [json.loads(line) for line in out.split("examples (as read, our schema): 3\n")[1].split("\nproblems:")[0].splitlines()]
    assert examples[0] == {"id": "deepmath/train/0", "prompt": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q0"}],
                           "answer": "0", "source": "deepmath"}  # fmt: skip
    assert [e["id"] for e in examples] == ["deepmath/train/0", "deepmath/train/1", "deepmath/train/2"]


def test_inspect_lists_every_problem_with_its_row_and_field_and_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rows = [
        verl_row(0, "q0", "0"),
        {**verl_row(1, "q1", "1"), "reward_model": {"style": "rule", "ground_truth": ""}},
        {**verl_row(2, "q2", "2"), "prompt": [{"role": "robot", "content": "q2"}]},
        verl_row(0, "q3", "3"),
        {**verl_row(4, "q4", "4"), "reward_model": {"style": "rule", "ground_truth": None}},
    ]
    path = write_verl(tmp_path / "bad.parquet", rows)
    code, out, _ = _run(capsys, "inspect", str(path))
    assert code == 1
    problems = out.split("problems: 4\n")[1].splitlines()
    assert [p.split(": field ")[0].strip() for p in problems] == [f"{path}:row {n}" for n in (2, 3, 4, 5)]
    assert "'reward_model.ground_truth': is empty" in problems[0]
    assert "'prompt[0]': unknown role 'robot'" in problems[1]
    assert f"'id': duplicate id 'deepmath/train/0', first at {path}:row 1" in problems[2]
    assert "'reward_model.ground_truth': missing" in problems[3]
    assert "answer types: string 4, null 1" in out


def test_inspect_of_a_list_ground_truth_counts_list_answers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_verl(tmp_path / "lists.parquet", [verl_row(0, "q", ["1", "one"])], ground_truth=pa.list_(pa.string()))
    code, out, _ = _run(capsys, "inspect", str(path))
    assert code == 1 and "answer types: list 1" in out and "row 1: field 'reward_model.ground_truth': is a list (2 items)" in out


def test_inspect_of_a_file_fitting_no_format_says_so_and_shows_its_fields(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "odd.jsonl"
    path.write_text(json.dumps({"text": "q", "label": 1}) + "\n" + json.dumps({"text": "r", "label": None}) + "\n")
    code, out, _ = _run(capsys, "inspect", str(path))
    assert code == 1
    assert "format:  (none)" in out and "rows:    2" in out and "  label: integer | null" in out
    assert "no known format has these columns (label, text)" in out


@pytest.mark.parametrize("fmt", ["auto", "verl"])
def test_convert_writes_our_jsonl_equal_to_what_training_reads(tmp_path: Path, capsys: pytest.CaptureFixture[str], fmt: str) -> None:
    path = write_verl(tmp_path / "train.parquet", [verl_row(i, f"q{i}", str(i)) for i in range(4)])
    out = tmp_path / "out" / "train.jsonl"
    code, stdout, _ = _run(capsys, "convert", str(path), "--format", fmt, "--out", str(out))
    assert code == 0 and f"wrote 4 records to {out}" in stdout
    assert read_prompts(out) == read_records(path)
    assert [p.name for p in out.parent.iterdir()] == ["train.jsonl"]  # no temporary file left


def test_convert_runs_the_public_dataset_converters(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "aime.jsonl"
    path.write_text(json.dumps({"id": 60, "problem": "Q", "answer": 204}) + "\n")
    out = tmp_path / "aime_ours.jsonl"
    assert _run(capsys, "convert", str(path), "--format", "aime", "--out", str(out))[0] == 0
    assert [json.loads(line) for line in out.read_text().splitlines()] == [{"id": "aime/60", "prompt": "Q", "answer": "204", "source": "aime"}]


BAD: list[tuple[str, list[dict[str, Any]], dict[str, Any], str]] = [
    ("list ground truth", [verl_row(0, "q", ["1", "2"])], {"ground_truth": pa.list_(pa.string())}, "row 1: field 'reward_model.ground_truth': is a list"),
    ("empty ground truth", [verl_row(0, "q", "1"), verl_row(1, "r", "")], {}, "row 2: field 'reward_model.ground_truth': is empty"),
    ("missing ground truth", [verl_row(0, "q", "1"), verl_row(1, "r", None)], {}, "row 2: field 'reward_model.ground_truth': missing"),
    ("prompt neither text nor messages", [{**verl_row(0, "q", "1"), "prompt": 7}], {"prompt": pa.int64()},
     "row 1: field 'prompt': must be a string or a non-empty list of messages"),
    ("unknown role", [verl_row(0, "q", "1"), {**verl_row(1, "r", "1"), "prompt": [{"role": "critic", "content": "r"}]}], {},
     "row 2: field 'prompt[0]': unknown role 'critic'"),
    ("id given twice", [verl_row(5, "q", "1"), verl_row(5, "r", "1")], {}, "row 2: field 'id': duplicate id 'deepmath/train/5'"),
]  # fmt: skip


@pytest.mark.parametrize(("what", "rows", "types", "named"), BAD, ids=[b[0] for b in BAD])
def test_convert_of_bad_input_names_file_row_and_field_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], what: str, rows: list[dict[str, Any]], types: dict[str, Any], named: str) -> None:  # fmt: skip
    path = write_verl(tmp_path / "bad.parquet", rows, **types)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old.jsonl").write_text("kept\n")
    code, _, err = _run(capsys, "convert", str(path), "--format", "verl", "--out", str(out / "new.jsonl"))
    assert code == 2
    assert f"megatron-pc data: error: {path}:{named}" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["old.jsonl"]  # nothing new, not even a temporary file
    code, _, err = _run(capsys, "convert", str(path), "--format", "verl", "--out", str(out / "old.jsonl"))
    assert code == 2 and (out / "old.jsonl").read_text() == "kept\n"  # an older output is left as it was


def test_convert_shows_a_progress_bar_on_large_files_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    big = write_verl(tmp_path / "big.parquet", [verl_row(i, f"q{i}", str(i)) for i in range(PROGRESS_MIN_ROWS)])
    code, _, err = _run(capsys, "convert", str(big), "--out", str(tmp_path / "big.jsonl"))
    assert code == 0 and f"{PROGRESS_MIN_ROWS}/{PROGRESS_MIN_ROWS}" in err and "row/s" in err
    assert _run(capsys, "convert", str(big), "--out", str(tmp_path / "quiet.jsonl"), "--no-progress")[2] == ""
    small = write_verl(tmp_path / "small.parquet", [verl_row(0, "q", "1")])
    assert _run(capsys, "convert", str(small), "--out", str(tmp_path / "small.jsonl"))[2] == ""
    assert len((tmp_path / "big.jsonl").read_text().splitlines()) == PROGRESS_MIN_ROWS
