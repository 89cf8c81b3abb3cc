"""Bad model directories and prompts are refused before any worker starts, naming the culprit."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from megatron_pc.driver.prepare import prepare
from megatron_pc.config import load_config
from megatron_pc.errors import ConfigError

pytestmark = pytest.mark.integration
SMALL = ["data.train_size=40", "data.validation_size=8"]


def test_chat_template_true_without_a_template_names_the_model_directory(tiny_model_dir: Path) -> None:
    cfg = load_config(None, [*SMALL, f"model.path={tiny_model_dir}", "data.chat_template=true"])
    with pytest.raises(ConfigError, match=r"data\.chat_template.*has no chat template") as err:
        prepare(cfg)
    assert str(tiny_model_dir) in str(err.value)


def test_a_tokenizer_without_eos_is_refused(tiny_model_dir: Path, tmp_path: Path) -> None:
    model = tmp_path / "no-eos"
    shutil.copytree(tiny_model_dir, model)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        path = model / name
        if path.exists():
            data = json.loads(path.read_text())
            data.pop("eos_token", None)
            path.write_text(json.dumps(data))
    cfg = load_config(None, [*SMALL, f"model.path={model}"])
    with pytest.raises(ConfigError, match="has no EOS token") as err:
        prepare(cfg)
    assert str(model) in str(err.value) and err.value.field == "model.path"


def test_a_prompt_over_the_limit_with_truncation_error_names_the_prompt(tiny_model_dir: Path) -> None:
    short = [*SMALL, f"model.path={tiny_model_dir}", "data.max_prompt_tokens=4"]
    ok = prepare(load_config(None, [*short, "data.max_truncated_share=1"]))
    assert max(len(t) for t in ok.train_tokens) == 4  # left truncation, the default
    with pytest.raises(ConfigError, match=r"more than data.max_truncated_share \(5.0%\)") as err:
        prepare(load_config(None, short))  # every prompt cut: past the default share
    assert err.value.field == "data.max_prompt_tokens" and "data.source (builtin:arithmetic)" in str(err.value)
    cfg = load_config(None, [*short, "data.prompt_truncation=error"])
    with pytest.raises(ConfigError, match=r"prompt 'arithmetic/.*' has \d+ tokens"):
        prepare(cfg)


def test_a_missing_model_directory_says_how_to_have_it_made(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="set model.make"):
        prepare(load_config(None, [*SMALL, f"model.path={tmp_path / 'absent'}"]))
    with pytest.raises(ConfigError, match="model.make: must be one of tiny, smollm2"):
        load_config(None, ["model.make=llama"])
