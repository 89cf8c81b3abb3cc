"""Bad input, fuzzed: every config and every data file either loads or is refused with our own
error naming the culprit (the field, or the file and line), never with a stray exception."""

from __future__ import annotations

import json

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from megatron_pc.config import Config, load_config, to_dict
from megatron_pc.data.records import read_prompts
from megatron_pc.errors import ConfigError, DataError

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
field_names = st.sampled_from(["id", "prompt", "answer", "question", "messages", "role", "content", "extra"])
rows = st.dictionaries(field_names, json_values | st.text(max_size=30), max_size=4) | json_values
lines = st.one_of(
    rows.map(lambda r: json.dumps(r).encode()),
    st.binary(max_size=40),  # not JSON, not UTF-8
    st.just(b""),
    st.just(b'{"id": "a", "prompt": "' + b"x" * 200_000 + b'", "answer": "1"}'),  # a huge line
)


@SETTINGS
@given(st.lists(lines, max_size=6))
def test_a_fuzzed_data_file_loads_or_is_refused_naming_the_file(tmp_path_factory, content: list[bytes]) -> None:
    path = tmp_path_factory.mktemp("data") / "prompts.jsonl"
    path.write_bytes(b"\n".join(content))
    try:
        records = read_prompts(path)
    except DataError as err:
        assert str(err).startswith(str(path)), err
        return
    assert records and len({r.id for r in records}) == len(records)


def _defaults() -> dict:
    return to_dict(Config())


def _keys(tree: dict, prefix: str = "") -> list[str]:
    out = []
    for k, v in tree.items():
        out += _keys(v, f"{prefix}{k}.") if isinstance(v, dict) else [prefix + k]
    return out


KEYS = _keys(_defaults())
yaml_values = st.none() | st.booleans() | st.integers(-(10**6), 10**6) | st.floats(allow_nan=True) | st.text(max_size=12) \
    | st.lists(st.integers(-5, 5), max_size=3) | st.dictionaries(st.text(max_size=5), st.integers(), max_size=2)  # fmt: skip


@SETTINGS
@given(st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=10), yaml_values, min_size=1, max_size=4))
def test_a_fuzzed_config_loads_or_is_refused_naming_a_field(tmp_path_factory, changes: dict) -> None:
    tree: dict = {}
    for dotted, value in changes.items():
        *parents, leaf = dotted.split(".") if dotted else [""]
        node = tree
        for p in parents:
            node = node.setdefault(p, {}) if isinstance(node.get(p, {}), dict) else {}
        node[leaf] = value
    path = tmp_path_factory.mktemp("cfg") / "run.yaml"
    path.write_text(yaml.safe_dump(tree))
    try:
        load_config(path, [])
    except ConfigError as err:
        assert err.field and err.rule, err


@SETTINGS
@given(st.sampled_from(KEYS), st.text(max_size=12))
def test_a_fuzzed_override_loads_or_is_refused_naming_its_field(key: str, value: str) -> None:
    try:
        load_config(None, [f"{key}={value}"])
    except ConfigError as err:
        assert err.field.startswith(key.split(".")[0]) or err.field == "<override>", (key, value, err)


@SETTINGS
@given(st.text(max_size=60))
def test_fuzzed_yaml_text_loads_or_is_refused_naming_the_file(tmp_path_factory, text: str) -> None:
    path = tmp_path_factory.mktemp("cfg") / "run.yaml"
    path.write_text(text)
    try:
        load_config(path, [])
    except ConfigError as err:
        assert err.field, err
