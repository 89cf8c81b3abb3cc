"""The tiny job on two emulated SLURM nodes (slurm/local/start.sh --nodes 2: a slurmd each, both
on this machine), through the real sbatch file and slurm/bootstrap.sh: the Ray head on the
first node, `srun ray start --block` on the second, the wait for both, a few training steps with
the policy's DP and the engines one a node. SIGUSR1 (what `#SBATCH --signal=B:USR1@60` sends
before the time limit) makes the driver checkpoint and exit 75; bootstrap requeues the job,
which resumes by itself and ends like the uninterrupted one.

Both slurmd run on one machine, so both Ray nodes have its address (Ray tells them apart by
node id); the emulated Ray cluster of test_multinode_run.py gives each node an address of its
own. Needs root and slurm-wlm + munge, as test_slurm_e2e.py.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from test_slurm_e2e import COMPARE, Job, _ray_processes, _rows, guard_bin  # noqa: F401  (guard_bin: a fixture)
from test_slurm_local import Cluster, _start, _stop

pytestmark = [pytest.mark.integration, pytest.mark.long]  # two 2-node jobs, ~4 min each on a quiet machine
STEPS = 3


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with pytest.MonkeyPatch.context() as patch:
        patch.delenv("OMP_NUM_THREADS", raising=False)  # start.sh sizes the nodes with nproc
        started = _start(tmp_path_factory.mktemp("slurm2"), "--nodes", "2")
    try:
        yield started
    finally:
        _stop(started)


@pytest.fixture(scope="module")
def straight(two_nodes: Cluster, guard_bin: Path, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Job, dict[str, str]]:
    job = Job(two_nodes, guard_bin, tiny_model, tmp_path_factory.mktemp("straight2"), nodes=2, steps=STEPS)
    return job, job.wait(timeout_s=1500)


def test_a_two_node_job_starts_ray_on_both_nodes_and_trains_to_the_end(straight: tuple[Job, dict[str, str]]) -> None:
    job, fields = straight
    log = job.log(tail=10**7)
    assert (fields["JobState"], fields["ExitCode"], fields["NumNodes"]) == ("COMPLETED", "0:0", "2"), log[-6000:]
    assert "bootstrap: starting a Ray worker on n2" in log
    assert job.steps() == list(range(STEPS + 1))
    assert all(r["logprob_gap"] <= 0.05 for s, r in _rows(job.run_dir).items() if s > 0)  # the sync check
    assert _ray_processes(job.ray_tmp) == [], "the job left its Ray running"


def test_sigusr1_checkpoints_the_two_node_job_which_requeues_itself_and_resumes(
        two_nodes: Cluster, guard_bin: Path, tiny_model: Path, tmp_path: Path, straight: tuple[Job, dict[str, str]]) -> None:  # fmt: skip
    job = Job(two_nodes, guard_bin, tiny_model, tmp_path, nodes=2, steps=STEPS)
    deadline = time.monotonic() + 1200
    while 1 not in job.steps():
        assert time.monotonic() < deadline and job.show().get("JobState") in ("PENDING", "RUNNING"), job.log()
        time.sleep(0.2)
    two_nodes.run("scancel", "--batch", "--signal=USR1", job.id)  # what --signal=B:USR1@60 sends
    deadline = time.monotonic() + 300
    while (fields := job.show()).get("Reason") != "BeginTime":  # requeued and held (SLURM 22.05: ~120 s)
        assert time.monotonic() < deadline and fields.get("JobState") not in ("COMPLETED", "FAILED", "CANCELLED"), f"{fields}\n{job.log()}"
        time.sleep(0.5)
    two_nodes.run("scontrol", "update", f"JobId={job.id}", "StartTime=now")
    fields = job.wait(timeout_s=1500)
    log = job.log(tail=10**7)
    assert (fields["JobState"], fields["ExitCode"], fields["Restarts"]) == ("COMPLETED", "0:0", "1"), log[-6000:]
    assert "got SIGUSR1: passing it to the driver" in log and "driver exited with 75" in log and "requeueing job" in log
    assert "resuming from" in log
    a, b = _rows(straight[0].run_dir), _rows(job.run_dir)
    assert sorted(b) == sorted(a) == list(range(STEPS + 1))
    for step in range(1, STEPS + 1):
        assert {k: b[step][k] for k in COMPARE} == {k: a[step][k] for k in COMPARE}, step
    assert _ray_processes(job.ray_tmp) == [], "the job left its Ray running"
