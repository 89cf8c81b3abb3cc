"""Prompt data: schema validation, readers, builtin sets, splits, converters, tokenization."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from megatron_pc.data import (
    ChatMessage,
    DataConfig,
    PromptRecord,
    convert_file,
    encode_prompt,
    load_prompts,
    read_prompts,
    write_jsonl,
)
from megatron_pc.data.arithmetic import arithmetic_prompts
from megatron_pc.errors import ConfigError, DataError


def _write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _char_tokenizer(chat_template: str | None = None) -> Any:
    """A character-level tokenizer built locally: nothing is downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = "0123456789+-*=<>/abcdefghijklmnopqrstuvwxyz "
    vocab = {c: i for i, c in enumerate(["[UNK]", *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]")
    wrapped.chat_template = chat_template
    return wrapped, vocab


def test_jsonl_rows_become_records_with_chat_prompts_and_optional_fields(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"id": "a", "prompt": "1+1=", "answer": "2", "extra": 5}) + "\n\n"
        + json.dumps({"id": "b", "prompt": [{"role": "user", "content": "hi"}], "answer": "x", "source": "s", "difficulty": 3}) + "\n"
    )
    records = read_prompts(path)
    assert records == [
        PromptRecord("a", "1+1=", "2", metadata=(("extra", 5),)),  # other scalar fields are kept as metadata
        PromptRecord("b", (ChatMessage("user", "hi"),), "x", "s", 3.0),
    ]
    out = tmp_path / "round.jsonl"
    write_jsonl(records, out)
    assert read_prompts(out) == records


@pytest.mark.parametrize(
    ("row", "field"),
    [
        ({"prompt": "q", "answer": "1"}, "id"),
        ({"id": "a", "prompt": "q", "answer": 1}, "answer"),
        ({"id": "a", "prompt": "", "answer": "1"}, "prompt"),
        ({"id": "a", "prompt": [{"role": "robot", "content": "q"}], "answer": "1"}, "prompt[0]"),
        ({"id": "a", "prompt": "q", "answer": "1", "difficulty": "hard"}, "difficulty"),
        ({"id": "a", "prompt": "q", "answer": "1", "difficulty": True}, "difficulty"),
        ({"id": "a", "prompt": "q", "answer": "1", "source": 3}, "source"),
        (["not", "an", "object"], "<row>"),
    ],
)
def test_bad_row_error_names_file_line_and_field(tmp_path: Path, row: Any, field: str) -> None:
    path = _write_jsonl(tmp_path / "bad.jsonl", [{"id": "ok", "prompt": "q", "answer": "1"}, row])
    with pytest.raises(DataError) as err:
        read_prompts(path)
    message = str(err.value)
    assert f"{path}:line 2" in message and f"field {field!r}" in message


def test_invalid_json_line_is_reported_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "prompt": "q", "answer": "1"}\n{oops\n')
    with pytest.raises(DataError, match=r"line 2: field '<json>'"):
        read_prompts(path)


def test_duplicate_id_error_names_both_lines(tmp_path: Path) -> None:
    rows = [{"id": "a", "prompt": "q", "answer": "1"}, {"id": "b", "prompt": "r", "answer": "1"}, {"id": "a", "prompt": "s", "answer": "2"}]
    path = _write_jsonl(tmp_path / "dup.jsonl", rows)
    with pytest.raises(DataError, match=r"line 3: field 'id': duplicate id 'a', first at .*line 1"):
        read_prompts(path)


def test_parquet_without_pyarrow_names_the_missing_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "p.parquet"
    path.write_bytes(b"PAR1")
    # None in sys.modules makes the import fail, whether or not pyarrow is installed.
    monkeypatch.setitem(sys.modules, "pyarrow", None)
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)
    with pytest.raises(ImportError, match="pyarrow"):
        read_prompts(path)


def test_unsupported_file_type_and_missing_file_are_data_errors(tmp_path: Path) -> None:
    (tmp_path / "p.csv").write_text("id,prompt,answer\n")
    with pytest.raises(DataError, match="unsupported file type"):
        read_prompts(tmp_path / "p.csv")
    with pytest.raises(DataError, match="no such file"):
        read_prompts(tmp_path / "absent.jsonl")


def test_arithmetic_prompts_are_deterministic_distinct_and_correct() -> None:
    records = arithmetic_prompts(500, seed=7)
    assert records == arithmetic_prompts(500, seed=7)
    assert records != arithmetic_prompts(500, seed=8)
    assert len({r.prompt for r in records}) == 500
    ops = set()
    for r in records:
        a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", r.prompt).groups()
        ops.add(op)
        expected = {"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op]
        assert r.answer == str(expected) and r.id == f"arithmetic/{r.prompt}"
        assert len(a) <= (3 if op == "*" else 4) and len(b) <= (1 if op == "*" else 4)
        assert r.difficulty == len(a) + len(b) + (2 if op == "*" else 0)
    assert ops == {"+", "-", "*"}
    assert {r.difficulty for r in records} == {2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0}


def test_builtin_split_has_requested_sizes_no_overlap_and_depends_on_seed() -> None:
    cfg = DataConfig(source="builtin:arithmetic", train_size=300, validation_size=100)
    train, val = load_prompts(cfg, seed=3)
    assert (len(train), len(val)) == (300, 100)
    assert not {r.id for r in train} & {r.id for r in val}
    assert not {r.prompt for r in train} & {r.prompt for r in val}
    assert load_prompts(cfg, seed=3) == (train, val)
    assert load_prompts(cfg, seed=4)[1] != val


def test_gsm_symbolic_builtin_gives_distinct_word_problems_with_integer_answers() -> None:
    train, val = load_prompts(DataConfig(source="builtin:gsm_symbolic", train_size=12, validation_size=4), seed=1)
    assert (len(train), len(val)) == (12, 4)
    assert not {r.prompt for r in train} & {r.prompt for r in val}
    assert all(re.fullmatch(r"-?\d+", r.answer) and r.source == "gsm_symbolic" for r in train + val)


def test_file_source_split_drops_train_copies_of_validation_prompts(tmp_path: Path) -> None:
    rows = [{"id": f"p{i}", "prompt": f"q{i % 8}", "answer": "1"} for i in range(10)]  # p8, p9 repeat q0, q1
    path = _write_jsonl(tmp_path / "pool.jsonl", rows)
    for seed in range(5):
        train, val = load_prompts(DataConfig(source=str(path), validation_size=3), seed=seed)
        assert len(val) == 3
        assert not {r.prompt for r in train} & {r.prompt for r in val}
        assert not {r.id for r in train} & {r.id for r in val}
        assert len(train) + len(val) >= 8


def test_explicit_validation_file_is_used_and_removed_from_train(tmp_path: Path) -> None:
    pool = _write_jsonl(tmp_path / "t.jsonl", [{"id": f"p{i}", "prompt": f"q{i}", "answer": "1"} for i in range(5)])
    valid = _write_jsonl(tmp_path / "v.jsonl", [{"id": "v0", "prompt": "q2", "answer": "1"}])
    train, val = load_prompts(DataConfig(source=str(pool), validation=str(valid)), seed=0)
    assert [r.id for r in val] == ["v0"]
    assert [r.id for r in train] == ["p0", "p1", "p3", "p4"]


def test_validation_size_that_leaves_no_training_prompts_is_rejected(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "p.jsonl", [{"id": "a", "prompt": "q", "answer": "1"}])
    with pytest.raises(DataError, match="validation_size"):
        load_prompts(DataConfig(source=str(path), validation_size=1), seed=0)


def test_data_config_rejects_unknown_builtin_and_non_data_files() -> None:
    with pytest.raises(ConfigError) as err:
        DataConfig(source="builtin:arith")
    assert err.value.field == "source" and "builtin:arithmetic" in err.value.rule
    with pytest.raises(ConfigError) as err:
        DataConfig(source="train.csv")
    assert err.value.field == "source"
    with pytest.raises(ConfigError) as err:
        DataConfig(validation="v.txt")
    assert err.value.field == "validation"


def test_encode_prompt_truncates_from_the_left() -> None:
    tokenizer, vocab = _char_tokenizer()
    record = PromptRecord("a", "12+345=", "357")
    assert encode_prompt(record, tokenizer, 64, chat_template=False) == [vocab[c] for c in "12+345="]
    assert encode_prompt(record, tokenizer, 3, chat_template=False) == [vocab[c] for c in "45="]


def test_encode_prompt_applies_chat_template_with_generation_prompt() -> None:
    template = "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
    tokenizer, vocab = _char_tokenizer(template)
    chat = PromptRecord("c", (ChatMessage("system", "be"), ChatMessage("user", "1+2=")), "3")
    assert encode_prompt(chat, tokenizer, 64, chat_template=True) == [vocab[c] for c in "<system>be<user>1+2=<a>"]
    plain = PromptRecord("p", "1+2=", "3")
    assert encode_prompt(plain, tokenizer, 8, chat_template=True) == [vocab[c] for c in "r>1+2=<a>"[-8:]]


def test_encode_prompt_rejects_chat_without_template() -> None:
    tokenizer, _ = _char_tokenizer()
    chat = PromptRecord("c", (ChatMessage("user", "1+2="),), "3")
    with pytest.raises(ValueError, match="chat_template"):
        encode_prompt(chat, tokenizer, 8, chat_template=False)
    with pytest.raises(ValueError, match="no chat template"):
        encode_prompt(chat, tokenizer, 8, chat_template=True)


@pytest.mark.parametrize(
    ("fmt", "row", "expected"),
    [
        ("deepmath", {"question": "Q", "final_answer": "\\frac12", "difficulty": 6.5, "r1_solution_1": "..."}, PromptRecord("deepmath/1", "Q", "\\frac12", "deepmath", 6.5)),
        ("polaris", {"problem": "Q", "answer": "3", "difficulty": "7/8"}, PromptRecord("polaris/1", "Q", "3", "polaris", 0.875)),
        ("aime", {"id": 60, "problem": "Q", "answer": 204, "url": "u"}, PromptRecord("aime/60", "Q", "204", "aime", None)),
        ("math500", {"problem": "Q", "answer": "(3, \\frac{\\pi}{2})", "level": 2, "unique_id": "test/precalculus/807.json"}, PromptRecord("math500/test/precalculus/807.json", "Q", "(3, \\frac{\\pi}{2})", "math500", 2.0)),
    ],
)
def test_converter_maps_dataset_columns_to_our_schema(tmp_path: Path, fmt: str, row: dict[str, Any], expected: PromptRecord) -> None:
    path = _write_jsonl(tmp_path / f"{fmt}.jsonl", [row])
    assert convert_file(path, fmt) == [expected]


def test_converter_names_missing_column_and_rejects_unknown_format(tmp_path: Path) -> None:
    path = _write_jsonl(tmp_path / "d.jsonl", [{"question": "Q", "answer": "1"}])
    with pytest.raises(DataError, match=r"format deepmath needs the columns final_answer, which the file lacks \(its columns: answer, question\)"):
        convert_file(path, "deepmath")
    with pytest.raises(DataError, match="unknown dataset format"):
        convert_file(path, "gsm8k")


def test_parquet_rows_are_read_and_a_bad_row_is_named(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    good = tmp_path / "good.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "prompt": "1+1=", "answer": "2"}, {"id": "b", "prompt": "2+2=", "answer": "4"}]), good)
    assert [r.answer for r in read_prompts(good)] == ["2", "4"]
    bad = tmp_path / "bad.parquet"
    pq.write_table(pa.Table.from_pylist([{"id": "a", "prompt": "1+1=", "answer": "2"}, {"id": "b", "prompt": "", "answer": "4"}]), bad)
    with pytest.raises(DataError, match=r"bad.parquet:row 2: field 'prompt'"):
        read_prompts(bad)


def test_damaged_parquet_file_is_a_data_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "damaged.parquet"
    path.write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(DataError, match="damaged.parquet: not a readable parquet file"):
        read_prompts(path)


def test_a_bad_data_file_is_refused_before_a_missing_model_is_made(tmp_path: Path) -> None:
    from megatron_pc.config import load_config
    from megatron_pc.driver.prepare import prepare
    from megatron_pc.errors import DataError

    data = tmp_path / "bad.jsonl"
    data.write_text('{"id": "a", "prompt": "1+1", "answer": "2"}\n{"id": "a", "prompt": "2+2", "answer": "4"}\n')
    model = tmp_path / "model"
    cfg = load_config(None, [f"model.path={model}", "model.make=tiny", f"data.source={data}"])
    with pytest.raises(DataError, match="duplicate id"):
        prepare(cfg)
    assert not model.exists()  # the minutes-long warm-up never started
