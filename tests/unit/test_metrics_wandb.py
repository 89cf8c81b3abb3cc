"""W&B settings without the wandb package, and the W&B run id kept in the run directory."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from megatron_pc.config import load_config
from megatron_pc.errors import ConfigError
from megatron_pc.metrics.config import LoggingConfig
from megatron_pc.metrics.logger import WANDB_ID_FILE, wandb_run_id


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
