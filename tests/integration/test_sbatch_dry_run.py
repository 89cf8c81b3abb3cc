"""The job files slurm/pc_*.sbatch and slurm/bootstrap.sh: dry runs, planner refusals, what the
local SLURM controller accepts, and the preemption contract (SIGUSR1 -> driver -> exit 75 -> requeue).

Ray, srun, scontrol requeue and the training driver are replaced by recording stand-ins at the
edge (the PATH), so nothing here starts a cluster process; `megatron-pc plan` and `config` are real.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_slurm_local import Cluster, _start, _stop  # noqa: E402  (helpers, not tests)

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
GPU_JOBS = {"pc_14b": 8, "pc_8b": 4, "pc_4b": 2, "pc_1.5b": 1}

# Stand-ins: each records its command line in $SPY_LOG. megatron-pc passes everything but
# `train` to the real one; `train` is the fake driver below.
SPY = '#!/usr/bin/env bash\necho "{name} $*" >> "$SPY_LOG"\n'
FAKE_MEGATRON_PC = f"""#!/usr/bin/env bash
echo "megatron-pc $*" >> "$SPY_LOG"
[ "$1" = train ] || exec {VENV_BIN}/megatron-pc "$@"
echo "driver RAY_ADDRESS=$RAY_ADDRESS" >> "$SPY_LOG"
# The contract: on SIGUSR1 checkpoint and exit 75. Short sleeps so the trap runs promptly.
trap 'echo "driver got USR1" >> "$SPY_LOG"; exit 75' USR1
touch "$SPY_LOG.driver-ready"
[ -z "${{FAKE_DRIVER_EXIT:-}}" ] || exit "$FAKE_DRIVER_EXIT"
for _ in $(seq 600); do sleep 0.1; done
exit 9
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A local controller with eight emulated 8 x H200 nodes (and one CPU node)."""
    started = _start(tmp_path_factory.mktemp("slurm"), "--gpu-nodes", "8")
    try:
        yield started
    finally:
        _stop(started)


@pytest.fixture
def spy_bin(tmp_path: Path) -> Path:
    """A PATH folder of stand-ins for ray, srun, python (wait_for_ray), scontrol requeue, megatron-pc."""
    spy = tmp_path / "bin"
    spy.mkdir()
    for name in ("ray", "srun", "python"):
        (spy / name).write_text(SPY.format(name=name))
    # scontrol: record `requeue`, answer everything else (show hostnames) for real.
    (spy / "scontrol").write_text(
        '#!/usr/bin/env bash\nif [ "$1" = requeue ]; then echo "scontrol $*" >> "$SPY_LOG"; exit 0; fi\n'
        'exec /usr/bin/scontrol "$@"\n'
    )
    (spy / "megatron-pc").write_text(FAKE_MEGATRON_PC)
    for tool in spy.iterdir():
        tool.chmod(0o755)
    return spy


def _job_env(cluster: Cluster, spy: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    """What an 8-node H200 job's batch shell has, plus our settings."""
    env = {
        **cluster.env,
        "PATH": f"{spy}:{os.environ['PATH']}",
        "MPC_VENV": "",  # keep the stand-ins first on PATH
        "SPY_LOG": str(tmp_path / "spy.log"),
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "8",
        "SLURM_JOB_NODELIST": "h200-[1-8]",
        "SLURM_GPUS_ON_NODE": "8",
        "SLURM_CPUS_ON_NODE": "96",
        "SLURM_SUBMIT_DIR": str(REPO),
        "MPC_RUN_ROOT": str(tmp_path / "runs"),
        "MPC_RAY_TMP": f"/tmp/mpc-test-{os.getpid()}",
        "MPC_NO_DATA_CHECK": "1",  # the paper configs' data files are not in the checkout
    }
    env.update(extra)
    return env


def _spied(tmp_path: Path) -> list[str]:
    log = tmp_path / "spy.log"
    return log.read_text().splitlines() if log.exists() else []


def _bash(script: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", f"slurm/{script}.sbatch"], cwd=REPO, env=env, capture_output=True, text=True, timeout=60)


def test_dry_run_of_pc_14b_prints_the_8_node_plan_and_the_commands_and_starts_nothing(
    cluster: Cluster, spy_bin: Path, tmp_path: Path
) -> None:
    proc = _bash("pc_14b", _job_env(cluster, spy_bin, tmp_path, MPC_DRY_RUN="1"))
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "cluster  8 nodes x 8 GPUs = 64 GPUs, colocated" in out and "device   H200: 140.4 GiB" in out
    assert "policy   TP=2 PP=1 DP=32 = 64 GPUs" in out and "\nfits\n" in out
    assert "ray start --head" in out and "--port=6379" in out
    # Workers on the 7 other nodes; the first node is the head.
    assert [f"worker h200-{k}:" in out for k in range(1, 9)] == [False] + [True] * 7
    assert "--num-gpus=8" in out and "--nodes=8 --gpus=64" in out
    run_dir = tmp_path / "runs" / "qwen3_14b-pilot_commit-4242"
    assert f"megatron-pc train {REPO}/configs/qwen3_14b.yaml run_dir={run_dir} allocation.strategy=pilot_commit" in out
    assert "driver exit 75 -> ray stop, scontrol requeue 4242" in out
    # Only the planner ran: no Ray, no srun, no driver, no directories.
    assert _spied(tmp_path) == [f"megatron-pc plan {REPO}/configs/qwen3_14b.yaml --nodes 8 --gpus-per-node 8 --no-data-check "
                                "allocation.strategy=pilot_commit"]
    assert not run_dir.exists() and not Path(f"/tmp/mpc-test-{os.getpid()}").exists()


def test_dry_run_passes_strategy_and_overrides_to_both_planner_and_driver(cluster: Cluster, spy_bin: Path, tmp_path: Path) -> None:
    env = _job_env(cluster, spy_bin, tmp_path, MPC_DRY_RUN="1", STRATEGY="dapo", MPC_OVERRIDES="training.steps=7 seed=3")
    proc = _bash("pc_14b", env)
    assert proc.returncode == 0, proc.stderr
    assert "allocation.strategy=dapo training.steps=7 seed=3" in _spied(tmp_path)[0]
    assert "qwen3_14b-dapo-4242 allocation.strategy=dapo training.steps=7 seed=3\n" in proc.stdout


def test_layout_the_planner_refuses_stops_the_job_with_the_planners_message(cluster: Cluster, spy_bin: Path, tmp_path: Path) -> None:
    # TP=3 divides neither the 40 heads of Qwen3-14B nor the 64 GPUs.
    proc = _bash("pc_14b", _job_env(cluster, spy_bin, tmp_path, MPC_DRY_RUN="1", MPC_OVERRIDES="model.tensor_parallel=3"))
    assert proc.returncode == 2
    assert "megatron-pc plan: refused: model.tensor_parallel=3 does not divide the 40 attention heads of Qwen3-14B" in proc.stderr
    assert "the planner refused this layout" in proc.stderr
    assert "REFUSED" in proc.stdout and "megatron-pc train" not in proc.stdout
    assert len(_spied(tmp_path)) == 1  # the planner, nothing after it


def test_job_on_fewer_nodes_than_its_config_is_refused_even_without_dry_run(cluster: Cluster, spy_bin: Path, tmp_path: Path) -> None:
    env = _job_env(cluster, spy_bin, tmp_path, SLURM_JOB_NUM_NODES="4", SLURM_JOB_NODELIST="h200-[1-4]")
    proc = _bash("pc_14b", env)
    assert proc.returncode == 2
    assert "but the cluster has 4 x 8 = 32" in proc.stderr
    assert not any(line.startswith(("ray", "srun")) for line in _spied(tmp_path))


def test_unknown_strategy_is_refused_before_anything_runs(cluster: Cluster, spy_bin: Path, tmp_path: Path) -> None:
    proc = _bash("pc_14b", _job_env(cluster, spy_bin, tmp_path, MPC_DRY_RUN="1", STRATEGY="ppo"))
    assert proc.returncode == 2
    assert "STRATEGY must be pilot_commit, grpo or dapo, got 'ppo'" in proc.stderr
    assert _spied(tmp_path) == []


@pytest.mark.parametrize("job", GPU_JOBS)
def test_local_controller_accepts_gpu_job_on_emulated_h200_nodes(cluster: Cluster, job: str) -> None:
    proc = cluster.run("sbatch", "--test-only", "--partition=h200", str(REPO / "slurm" / f"{job}.sbatch"), check=False)
    assert proc.returncode == 0, proc.stderr
    nodes = GPU_JOBS[job]
    assert ("on nodes h200-1" if nodes == 1 else f"on nodes h200-[1-{nodes}]") in proc.stderr


def test_local_controller_accepts_the_tiny_cpu_job(cluster: Cluster) -> None:
    proc = cluster.run("sbatch", "--test-only", str(REPO / "slurm" / "pc_tiny_cpu.sbatch"), check=False)
    assert proc.returncode == 0, proc.stderr
    assert "to start at" in proc.stderr


def _cpu_job_env(spy: Path, tmp_path: Path, **extra: str) -> dict[str, str]:
    """A one-node CPU job (the tiny run): no SLURM config needed, no GPUs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(
        PATH=f"{spy}:{os.environ['PATH']}", MPC_VENV="", SPY_LOG=str(tmp_path / "spy.log"), SLURM_JOB_ID="777",
        SLURM_JOB_NUM_NODES="1", SLURM_SUBMIT_DIR=str(REPO), MPC_RUN_ROOT=str(tmp_path / "runs"),
        MPC_RAY_TMP=f"/tmp/mpc-test-{os.getpid()}",
    )  # fmt: skip
    env.update(extra)
    return env


def _wait_for_the_driver(job: subprocess.Popen, tmp_path: Path) -> None:
    """Until the job's fake driver says it runs (it writes spy.log.driver-ready), at most 30 s."""
    ready = tmp_path / "spy.log.driver-ready"
    deadline = time.monotonic() + 30
    while not ready.exists() and job.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert ready.exists(), "the fake driver never started"


def test_usr1_reaches_the_driver_and_its_exit_75_stops_ray_and_requeues_the_job(spy_bin: Path, tmp_path: Path) -> None:
    job = subprocess.Popen(["bash", "slurm/pc_tiny_cpu.sbatch"], cwd=REPO, env=_cpu_job_env(spy_bin, tmp_path), stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_the_driver(job, tmp_path)
        job.send_signal(signal.SIGUSR1)  # what `--signal=B:USR1@60` does: the batch shell only
        _, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:  # a failed run must not leave the job and its fake driver behind
            job.kill()
            job.communicate()
    assert job.returncode == 75, err
    calls = _spied(tmp_path)
    assert calls[0] == f"megatron-pc config {REPO}/configs/tiny_cpu.yaml allocation.strategy=pilot_commit"  # no GPU plan
    assert calls[1].startswith("ray start --head --node-ip-address=127.0.0.1 --port=6379")
    assert calls[2].startswith("python ") and "--nodes=1 --gpus=0" in calls[2]
    assert "driver RAY_ADDRESS=127.0.0.1:6379" in calls
    assert calls[-3:] == ["driver got USR1", "ray stop", "scontrol requeue 777"]
    assert (tmp_path / "runs" / "tiny_cpu-pilot_commit-777").is_dir()
    assert not any(c.startswith("srun") for c in calls)  # one node: the head alone


def test_driver_failure_code_is_the_job_code_and_nothing_is_requeued(spy_bin: Path, tmp_path: Path) -> None:
    proc = _bash("pc_tiny_cpu", _cpu_job_env(spy_bin, tmp_path, FAKE_DRIVER_EXIT="3", STRATEGY="grpo"))
    assert proc.returncode == 3
    calls = _spied(tmp_path)
    assert any(c.startswith("megatron-pc train") and "allocation.strategy=grpo" in c for c in calls)
    assert calls[-1] == "ray stop"
    assert not any(c.startswith("scontrol") for c in calls)


def test_dry_run_with_mpc_container_puts_every_python_command_in_the_image_through_pyxis(
    cluster: Cluster, spy_bin: Path, tmp_path: Path
) -> None:
    image = "nvcr.io#nvidia/pytorch:26.01-py3"
    env = _job_env(cluster, spy_bin, tmp_path, MPC_DRY_RUN="1", MPC_CONTAINER=image, MPC_CONTAINER_MOUNTS="/models:/models", SLURMD_NODENAME="h200-1")
    proc = _bash("pc_14b", env)
    assert proc.returncode == 0, proc.stderr
    run_root = tmp_path / "runs"
    mounts = f"--container-mounts={REPO}:{REPO},{run_root}:{run_root},/models:/models"
    in_image = f"--overlap --nodes=1 --ntasks=1 -w h200-1 --container-image={image} {mounts} --container-workdir={REPO}"
    # The planner ran in the image on the head node (srun is the stand-in, so it printed no plan).
    assert _spied(tmp_path) == [f"srun {in_image} megatron-pc plan {REPO}/configs/qwen3_14b.yaml --nodes 8 --gpus-per-node 8 "
                                "--no-data-check allocation.strategy=pilot_commit"]
    out = proc.stdout.replace("\\#", "#").replace("\\,", ",")  # the dry run prints commands shell-quoted
    # The head holds the node's CPUs and GPUs in its own step and blocks (a step's processes end with it).
    head = f"srun --overlap --nodes=1 --ntasks=1 -w h200-1 --cpus-per-task=96 --gpus-per-node=8 --container-image={image} {mounts}"
    assert head in out and "ray start --head" in out and "--disable-usage-stats --block" in out
    workers = [line for line in out.splitlines() if "ray start --address=" in line]
    assert len(workers) == 7
    assert all(f"--gpus-per-node=8 --container-image={image} {mounts} --container-workdir={REPO} -w h200-" in w for w in workers)
    assert f"srun {in_image} python {REPO}/slurm/lib/wait_for_ray.py" in out
    assert "RAY_ADDRESS=" in out and f"srun {in_image} megatron-pc train {REPO}/configs/qwen3_14b.yaml" in out
    assert not run_root.exists()  # a dry run makes no directory, not even the one to mount


def test_without_mpc_container_no_command_goes_through_pyxis(cluster: Cluster, spy_bin: Path, tmp_path: Path) -> None:
    proc = _bash("pc_14b", _job_env(cluster, spy_bin, tmp_path, MPC_DRY_RUN="1"))
    assert proc.returncode == 0, proc.stderr
    assert "--container-" not in proc.stdout and "--overlap" not in proc.stdout


# pyxis stand-in: record the srun options, then run the command itself (exec, so signals reach it).
PASS_THROUGH_SRUN = """#!/usr/bin/env bash
opts=()
while [ $# -gt 0 ]; do
    case "$1" in
        -w) opts+=("$1" "$2"); shift 2 ;;
        -*) opts+=("$1"); shift ;;
        *) break ;;
    esac
done
echo "srun ${opts[*]} -- $1" >> "$SPY_LOG"
exec "$@"
"""


def test_container_job_runs_each_step_in_the_image_and_usr1_still_checkpoints_and_requeues(spy_bin: Path, tmp_path: Path) -> None:
    (spy_bin / "srun").write_text(PASS_THROUGH_SRUN)
    env = _cpu_job_env(spy_bin, tmp_path, MPC_CONTAINER="registry#megatron-pc:gpu", SLURMD_NODENAME="n1")
    job = subprocess.Popen(["bash", "slurm/pc_tiny_cpu.sbatch"], cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for_the_driver(job, tmp_path)
        job.send_signal(signal.SIGUSR1)
        _, err = job.communicate(timeout=30)
    finally:
        if job.poll() is None:
            job.kill()
            job.communicate()
    assert job.returncode == 75, err
    calls = _spied(tmp_path)
    steps = [c for c in calls if c.startswith("srun ")]
    # config check, Ray head (in the background, so in any order), wait, driver: each a step in
    # the image on the head node.
    assert sorted(s.split(" -- ")[1] for s in steps) == ["megatron-pc", "megatron-pc", "python", "ray"]
    assert all("--overlap" in s and "-w n1" in s and "--container-image=registry#megatron-pc:gpu" in s for s in steps)
    assert any(c.startswith("ray start --head") and c.endswith("--block") for c in calls)
    assert "driver got USR1" in calls and calls[-1] == "scontrol requeue 777"
    assert "ray stop" not in calls  # the head is a step, stopped like a worker
    assert "in registry#megatron-pc:gpu" in err


def test_container_gpu_job_checks_cuda_in_the_image_in_a_step_that_sees_the_gpus(spy_bin: Path, tmp_path: Path) -> None:
    (spy_bin / "srun").write_text(PASS_THROUGH_SRUN)
    env = _cpu_job_env(spy_bin, tmp_path, MPC_CONTAINER="registry#megatron-pc:gpu", SLURMD_NODENAME="n1",
                       SLURM_GPUS_ON_NODE="8", SLURM_CPUS_ON_NODE="96", FAKE_DRIVER_EXIT="0",
                       MPC_NO_DATA_CHECK="1")  # the paper config's data files are not in the checkout  # fmt: skip
    proc = _bash("pc_1.5b", env)
    assert proc.returncode == 0, proc.stderr
    calls = _spied(tmp_path)
    # The stand-in python (the image's) was asked about CUDA right after the srun of a GPU step.
    cuda = next(i for i, c in enumerate(calls) if c.startswith("python -c import sys, torch"))
    assert calls[cuda - 1].startswith("srun --overlap --nodes=1 --ntasks=1 -w n1 --cpus-per-task=96 --gpus-per-node=8 --container-image=registry#megatron-pc:gpu")
    assert any(c.startswith("megatron-pc train") for c in calls[cuda:])  # the check came before the driver


def test_missing_data_files_stop_the_job_before_ray_naming_each_file(cluster: Cluster, spy_bin: Path, tmp_path: Path) -> None:
    env = _job_env(cluster, spy_bin, tmp_path, MPC_DRY_RUN="1")
    del env["MPC_NO_DATA_CHECK"]
    proc = _bash("pc_14b", env)
    assert proc.returncode == 2, proc.stderr
    assert "data.validation[6].path: data/olympiadbench.jsonl: no such file" in proc.stderr
    assert "nothing was started" in proc.stderr.splitlines()[-1]
    assert not any(line.startswith(("ray", "srun")) for line in _spied(tmp_path))


def test_a_dry_run_where_scontrol_cannot_read_slurm_conf_shows_scontrols_own_error(spy_bin: Path, tmp_path: Path) -> None:
    # Outside a cluster (no SLURM_CONF, no /etc/slurm/slurm.conf) scontrol cannot expand the node list.
    env = _cpu_job_env(spy_bin, tmp_path, MPC_DRY_RUN="1", SLURM_JOB_NUM_NODES="2", SLURM_JOB_NODELIST="cpu-[1-2]")
    proc = _bash("pc_tiny_cpu", env)
    assert proc.returncode == 2, proc.stderr
    last = proc.stderr.splitlines()[-1]
    assert "scontrol show hostnames cpu-[1-2] failed: scontrol: " in last and "slurm.conf" in last
    assert "names 0 nodes" not in proc.stderr
