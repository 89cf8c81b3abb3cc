"""The dataclass defaults are a real GPU run's (the Qwen3-4B recipe on one GPU); the tiny CPU run
writes its small values in configs/tiny_cpu.yaml and still resolves as it did field for field;
a command given no CONFIG runs the tiny run unless it names its own data."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from megatron_pc.config import CONFIGS_DIR, DEFAULTS, TINY_CONFIG, Config, load_config, to_dict
from megatron_pc.config_cli import OWN_DATA_NOTE, main as config_main, resolve_config_args
from megatron_pc.errors import ConfigError

PINNED = Path(__file__).with_name("tiny_cpu_resolved.yaml")


def _leaves(data: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_leaves(value, f"{prefix}{key}.") if isinstance(value, dict) else {f"{prefix}{key}": value})
    return out


def test_the_tiny_run_resolves_field_for_field_as_when_its_values_were_the_defaults() -> None:
    pinned = _leaves(yaml.safe_load(PINNED.read_text()))
    now = _leaves(to_dict(load_config(TINY_CONFIG)))
    assert {k: now.get(k) for k in pinned if now.get(k) != pinned[k]} == {}
    # A field added since takes its dataclass default in the tiny run.
    defaults = _leaves(to_dict(Config()))
    assert {k: v for k, v in now.items() if k not in pinned and v != defaults[k]} == {}


def test_no_config_is_the_tiny_run_and_a_name_resolves_to_configs() -> None:
    tiny = load_config(TINY_CONFIG)
    assert load_config(None) == tiny == load_config("tiny_cpu")
    assert load_config("qwen3_14b") == load_config(CONFIGS_DIR / "qwen3_14b.yaml")
    assert load_config(DEFAULTS) == Config()


def test_a_missing_config_lists_the_names_it_knows() -> None:
    with pytest.raises(ConfigError, match="qwen3_14b.*tiny_cpu") as err:
        load_config("qwen3_41b")
    assert err.value.field == "config"


def test_the_defaults_are_the_qwen3_4b_recipe_on_one_gpu() -> None:
    recipe = _leaves(to_dict(load_config("qwen3_4b")))
    defaults = _leaves(to_dict(Config()))
    differ = sorted(k for k in defaults if defaults[k] != recipe[k])
    # Only the name, the 4B run's seven validation sets and its layout (16 GPUs) are its own, and
    # DAPO's 3 x train_batch prompts a round (the default follows train_batch), and its weight-sync
    # bucket, which the paper configs size from their model (the embedding less one layer).
    assert differ == ["allocation.dapo_batch", "cluster.data_parallel", "data.validation", "name", "rollout.engines", "rollout.sync_bucket_mb"]
    cfg = Config()
    assert (cfg.data.max_prompt_tokens, cfg.rollout.max_tokens, cfg.data.chat_template) == (2048, 4096, True)
    assert (cfg.reward.function, cfg.allocation.n, cfg.allocation.train_batch) == ("math_verify", 64, 128)


def test_tiny_run_values_are_small_ones_written_in_its_file() -> None:
    written = _leaves(yaml.safe_load(TINY_CONFIG.read_text()))
    assert written["rollout.max_tokens"] == 16 and written["reward.function"] == "exact_int"
    assert written["data.chat_template"] is False and written["data.max_prompt_tokens"] == 64


@pytest.mark.parametrize(("argv", "path", "noted"), [
    ([], None, False),
    (["model.path=/m"], None, False),
    (["data.source=builtin:gsm_symbolic"], None, False),
    (["data.source=qa.jsonl", "model.path=/m"], DEFAULTS, True),
    (["tiny_cpu", "data.source=qa.jsonl"], "tiny_cpu", False),
])  # fmt: skip
def test_no_config_with_your_own_data_takes_the_defaults_and_says_so(argv: list[str], path: str | None, noted: bool) -> None:
    got, overrides, note = resolve_config_args(argv[0] if argv else None, argv[1:])
    assert got == path and (note == OWN_DATA_NOTE) is noted
    assert [*([] if got is None or got == DEFAULTS else [got]), *overrides] == argv


def test_config_command_prints_the_note_as_a_yaml_comment(capsys: pytest.CaptureFixture[str]) -> None:
    assert config_main(["data.source=qa.jsonl", "model.path=/m", "--no-data-check"]) == 0
    out = capsys.readouterr().out
    first, rest = out.split("\n", 1)
    assert first.startswith("# no CONFIG given") and "docs/config.md" in first
    resolved = yaml.safe_load(rest)
    assert resolved["rollout"]["max_tokens"] == 4096 and resolved["data"]["source"] == "qa.jsonl"
