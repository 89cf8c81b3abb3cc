"""The GPU set (setup.py's ``GPU`` list, installed by ``scripts/install.sh --gpu``): every
direct requirement has a binary wheel for the cluster's platform, and their declared
requirements agree with one another (docs/gpu_install.md).

Both checks ask PyPI (pip's ``--dry-run --no-deps --report``), so they need the network; without
it they fail, naming it. PyPI here serves no separate wheel metadata (PEP 658), so pip
downloads each wheel (torch and vLLM are some 850 MB) to read its metadata; one pip call per
Python version, shared by the tests of this file.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
PYTHONS = ("3.11", "3.12")
# The cluster's platform: x86_64 Linux with glibc 2.34 or newer (RHEL/Rocky 9; Ubuntu 22.04 has
# 2.35). pip matches manylinux tags exactly, so every tag such a machine accepts is listed;
# a wheel that needs a newer glibc (manylinux_2_35 and up) fails the check.
CLUSTER_PLATFORMS = ["manylinux2014_x86_64", *(f"manylinux_2_{n}_x86_64" for n in range(17, 35))]
PIP_TIMEOUT_S = 600


def gpu_requirements(setup_py: Path = REPO / "setup.py") -> list[Requirement]:
    """The ``GPU`` list of setup.py, read without running setup.py.

    Its items are string literals or names of string constants assigned earlier in the file.
    """
    constants: dict[str, Any] = {}
    for node in ast.parse(setup_py.read_text()).body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if name == "GPU":
            assert isinstance(node.value, ast.List), f"{setup_py}: GPU must be a list"
            return [Requirement(_string(item, constants, setup_py)) for item in node.value.elts]
        if isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            constants[name] = node.value.value
    raise AssertionError(f"{setup_py} has no GPU = [...] list")


def _string(node: ast.expr, constants: dict[str, Any], setup_py: Path) -> str:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in constants:
        return constants[node.id]
    raise AssertionError(f"{setup_py}:{node.lineno}: a GPU requirement must be a string or a string constant")


def pip_report(python: str, requirements: list[Requirement], tmp: Path) -> dict[str, dict[str, Any]]:
    """Name -> pip's report entry for each requirement, resolved as binary wheels for ``python``
    on the cluster's platforms, without their dependencies; fails naming what pip said."""
    report = tmp / f"report-{python}.json"
    platforms = [arg for tag in CLUSTER_PLATFORMS for arg in ("--platform", tag)]
    cmd = [
        sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--ignore-installed", "--quiet",
        "--only-binary=:all:", "--python-version", python, "--implementation", "cp", *platforms,
        "--target", str(tmp / f"target-{python}"), "--report", str(report), *map(str, requirements),
    ]  # fmt: skip
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        pytest.fail(f"pip took over {PIP_TIMEOUT_S} s to resolve the GPU set for Python {python}: is PyPI reachable?")
    if proc.returncode != 0:
        errors = [line for line in proc.stderr.splitlines() if "WARNING: Location" not in line]
        pytest.fail(
            f"no binary wheel set for Python {python} on {CLUSTER_PLATFORMS[-1]} (and older tags); this check needs "
            f"network access to PyPI. pip said:\n" + "\n".join(errors[-15:])
        )
    entries = json.loads(report.read_text())["install"]
    return {_canonical(e["metadata"]["name"]): e for e in entries}


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


@pytest.fixture(scope="module")
def reports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, dict[str, Any]]]:
    """Python version -> pip's report of the GPU set for it (one pip call each)."""
    tmp = tmp_path_factory.mktemp("gpu-wheels")
    requirements = gpu_requirements()
    return {python: pip_report(python, requirements, tmp) for python in PYTHONS}


def target_environment(python: str) -> dict[str, str]:
    """Marker environment of a cluster node running ``python``."""
    env = dict(default_environment())
    env.update(python_version=python, python_full_version=f"{python}.0", sys_platform="linux",
               platform_system="Linux", platform_machine="x86_64", os_name="posix",
               implementation_name="cpython", platform_python_implementation="CPython", extra="")  # fmt: skip
    return env


def declared(entry: dict[str, Any], python: str) -> dict[str, Requirement]:
    """Name -> requirement, of what a package declares that applies on the cluster (no extras)."""
    env = target_environment(python)
    result = {}
    for text in entry["metadata"].get("requires_dist", []):
        req = Requirement(text)
        if req.marker is None or req.marker.evaluate(env):
            result[_canonical(req.name)] = req
    return result


def _pin(name: str) -> Version:
    (spec,) = next(r for r in gpu_requirements() if _canonical(r.name) == name).specifier
    assert spec.operator == "==", f"setup.py GPU: {name} must be pinned exactly, is {spec}"
    return Version(spec.version)


def test_gpu_set_is_read_from_setup_py_with_the_engine_torch_and_trainer_pinned_exactly() -> None:
    names = [_canonical(r.name) for r in gpu_requirements()]
    assert {"vllm", "torch", "megatron-core", "transformers", "ray", "math-verify"} <= set(names)
    assert len(names) == len(set(names)), f"a package is listed twice in setup.py's GPU list: {names}"
    assert not any(n.startswith("transformer-engine") for n in names), "Transformer Engine is optional (the te extra)"
    for name in ("vllm", "torch", "megatron-core", "transformers", "ray", "math-verify"):
        _pin(name)


def test_reading_setup_py_refuses_a_gpu_item_that_is_not_a_string(tmp_path: Path) -> None:
    bad = tmp_path / "setup.py"
    bad.write_text('RAY = "ray==1"\nGPU = ["torch==2", RAY, make_pin()]\n')
    with pytest.raises(AssertionError, match="setup.py:2: a GPU requirement must be a string"):
        gpu_requirements(bad)


@pytest.mark.parametrize("python", PYTHONS)
def test_every_gpu_requirement_has_a_binary_wheel_for_the_cluster(reports: dict[str, Any], python: str) -> None:
    found = reports[python]
    for req in gpu_requirements():
        entry = found.get(_canonical(req.name))
        assert entry is not None, f"pip resolved no wheel for {req} on Python {python}"
        url = entry["download_info"]["url"]
        assert url.endswith(".whl"), f"{req} for Python {python} is not a wheel: {url}"
        assert Version(entry["metadata"]["version"]) in req.specifier


@pytest.mark.parametrize("python", PYTHONS)
def test_pinned_vllm_requires_exactly_our_torch_and_admits_our_transformers(reports: dict[str, Any], python: str) -> None:
    vllm = declared(reports[python]["vllm"], python)
    assert str(vllm["torch"].specifier) == f"=={_pin('torch')}", f"vllm {_pin('vllm')} requires {vllm['torch']}"
    assert _pin("transformers") in vllm["transformers"].specifier, f"vllm {_pin('vllm')} requires {vllm['transformers']}"


@pytest.mark.parametrize("python", PYTHONS)
def test_every_gpu_package_supports_the_python_version(reports: dict[str, Any], python: str) -> None:
    for name, entry in reports[python].items():
        requires_python = entry["metadata"].get("requires_python") or ""
        assert SpecifierSet(requires_python).contains(f"{python}.0"), f"{name} requires Python {requires_python}"


@pytest.mark.parametrize("python", PYTHONS)
def test_gpu_packages_agree_with_what_each_other_requires(reports: dict[str, Any], python: str) -> None:
    found = reports[python]
    versions = {name: Version(entry["metadata"]["version"]) for name, entry in found.items()}
    clashes = [
        f"{name} {versions[name]} requires {req}, the GPU set has {other} {versions[other]}"
        for name, entry in found.items()
        for other, req in declared(entry, python).items()
        if other in versions and not req.specifier.contains(versions[other], prereleases=True)
    ]
    assert not clashes, "\n".join(clashes)
