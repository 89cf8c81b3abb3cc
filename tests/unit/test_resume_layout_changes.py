"""A resume may change the layout (the policy's DP, TP and PP, the engines' number and TP); any
other change is still refused before any worker starts, naming the field. That the checkpoint
really reshards is tests/integration/test_resume_reshard.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_pc.config import load_config
from megatron_pc.driver.prepare import config_changes, record_config
from megatron_pc.errors import ConfigError


def _saved_run(tmp_path: Path, *overrides: str) -> Path:
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    record_config(load_config(None, [f"run_dir={run}", *overrides]), run)
    return run


@pytest.mark.parametrize(("saved", "resumed"), [
    (["cluster.data_parallel=2"], ["cluster.data_parallel=1"]),
    (["cluster.data_parallel=1"], ["cluster.data_parallel=2"]),
    (["rollout.engines=1"], ["rollout.engines=2"]),
    (["cluster.data_parallel=2", "rollout.engines=2"], ["cluster.data_parallel=4", "rollout.engines=1"]),
    (["model.tensor_parallel=1"], ["model.tensor_parallel=2"]),
    (["model.pipeline_parallel=2"], ["model.pipeline_parallel=1"]),
    (["rollout.tensor_parallel=1"], ["rollout.tensor_parallel=2"]),
])  # fmt: skip
def test_a_resume_may_change_the_layout(tmp_path: Path, saved: list[str], resumed: list[str]) -> None:
    run = _saved_run(tmp_path, *saved)
    record_config(load_config(None, [f"run_dir={run}", *resumed]), run)  # no error
    section, rest = resumed[0].split(".", 1)
    key, value = rest.split("=")
    assert f"{key}: {value}" in (run / "config.yaml").read_text().split(f"{section}:", 1)[1]


def test_a_change_beyond_the_layout_is_refused_naming_the_field(tmp_path: Path) -> None:
    run = _saved_run(tmp_path)
    with pytest.raises(ConfigError) as err:
        record_config(load_config(None, [f"run_dir={run}", "model.params_dtype=bfloat16"]), run)
    assert err.value.field == "model.params_dtype" and "different configuration" in str(err.value)


def test_a_layout_change_together_with_another_change_still_names_the_other_setting(tmp_path: Path) -> None:
    run = _saved_run(tmp_path)
    with pytest.raises(ConfigError, match=r"allocation.binding: True -> False"):
        record_config(load_config(None, [f"run_dir={run}", "cluster.data_parallel=2", "allocation.binding=false"]), run)


def test_config_changes_leaves_out_the_resumable_layout_fields() -> None:
    saved = {"cluster.data_parallel": 2, "rollout.engines": 4, "model.tensor_parallel": 1, "model.params_dtype": "auto"}
    current = {"cluster.data_parallel": 1, "rollout.engines": 1, "model.tensor_parallel": 2, "model.params_dtype": "float32"}
    assert config_changes(saved, current) == [("model.params_dtype", "auto", "float32")]
