"""W&B settings without the wandb package, and the W&B run id kept in the run directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from megatron_pc.config import load_config
from megatron_pc.errors import ConfigError
from megatron_pc.metrics.config import LoggingConfig
from megatron_pc.metrics.logger import WANDB_ID_FILE, WandbNaming, wandb_naming, wandb_run_id


def test_asking_for_wandb_without_the_package_is_a_config_error_saying_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules hides the package whether or not it is installed.
    monkeypatch.setitem(sys.modules, "wandb", None)
    with pytest.raises(ConfigError, match=r"logging\.wandb_project: is 'mpc' but the wandb package is not installed: pip install 'megatron-pc\[wandb\]'"):
        load_config(None, ["logging.wandb_project=mpc"])
    assert LoggingConfig().wandb_project is None  # no W&B asked for: no error


def test_an_empty_wandb_project_is_refused() -> None:
    with pytest.raises(ConfigError, match="wandb_project: must name a W&B project"):
        LoggingConfig(wandb_project="")


def test_the_wandb_run_id_is_made_once_and_kept_in_the_run_directory(tmp_path: Path) -> None:
    first = wandb_run_id(tmp_path / "run")
    assert len(first) == 8 and first.isalnum() and first == first.lower()
    assert (tmp_path / "run" / WANDB_ID_FILE).read_text().strip() == first
    assert wandb_run_id(tmp_path / "run") == first
    assert wandb_run_id(tmp_path / "other") != first


def test_the_wandb_run_is_named_by_config_strategy_and_seed_grouped_by_config_and_tagged() -> None:
    naming = wandb_naming(LoggingConfig(), "qwen3_4b", "grpo", 7, "/models/Qwen3-4B-Base/")
    assert naming == WandbNaming("qwen3_4b-grpo-7", None, "qwen3_4b", ["grpo", "Qwen3-4B-Base"])
    # PC, GRPO and DAPO runs of one config no longer share a name.
    assert len({wandb_naming(LoggingConfig(), "c", s, 0, "m").name for s in ("pilot_commit", "grpo", "dapo")}) == 3


def test_every_wandb_naming_field_can_be_set(tmp_path: Path) -> None:
    cfg = load_config(None, ["logging.wandb_entity=lab", "logging.wandb_name=mine", "logging.wandb_group=ablation",
                             "logging.wandb_tags=[a, b]"]).logging  # fmt: skip
    assert wandb_naming(cfg, "tiny_cpu", "dapo", 1, "m") == WandbNaming("mine", "lab", "ablation", ["a", "b"])
    assert wandb_naming(LoggingConfig(wandb_tags=[]), "n", "dapo", 1, "m").tags == []  # no tags at all
    with pytest.raises(ConfigError, match="logging.wandb_group: must not be empty"):
        load_config(None, ["logging.wandb_group="])
    with pytest.raises(ConfigError, match="logging.samples: must be >= 0"):
        load_config(None, ["logging.samples=-1"])
