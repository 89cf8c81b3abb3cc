"""The local SLURM test cluster (slurm/local/start.sh, stop.sh) runs real jobs and checks GPU jobs.

Needs root and slurm-wlm + munge (``slurm/local/install.sh``); the daemons are started once
for the module and stopped in the fixture's teardown, which also checks that none is left.
Without them every SLURM test FAILS naming the command to run as root (:func:`require_cluster_packages`):
an install without root skips the packages, and the tests must not pass silently.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
INSTALL = REPO / "slurm" / "local" / "install.sh"
START = REPO / "slurm" / "local" / "start.sh"
STOP = REPO / "slurm" / "local" / "stop.sh"
# Ports used by one cluster: slurmctld P, slurmd P+1, and B+1.. B+108 for named nodes.
NODE_PORT_SPAN = 110


@dataclass
class Cluster:
    """A running local cluster: its run directory and the environment that reaches it."""

    run_dir: Path
    env: dict[str, str]
    start_args: list[str]

    def run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command against this cluster."""
        return subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=60, check=check)

    def daemon_pids(self) -> list[int]:
        """Pids recorded by the daemons of this cluster that are still alive."""
        files = [*self.run_dir.glob("slurm*.pid"), self.run_dir / "munge" / "munged.pid"]
        pids = [int(f.read_text().strip()) for f in files if f.is_file() and f.read_text().strip()]
        return [p for p in pids if Path(f"/proc/{p}").exists()]


def _ports_free(ports: range) -> bool:
    for port in ports:
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                return False
    return True


def _ephemeral_ports() -> range:
    """The kernel's range for outgoing connections' local ports (Linux's default if unreadable)."""
    try:
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    except (OSError, ValueError):
        low, high = 32768, 60999
    return range(low, high + 1)


def _free_ports() -> tuple[int, int]:
    """A controller port pair and a node port range nobody listens on, so a developer's own
    local cluster (default ports) or another test run on the shared machine is not hit; both
    outside the ephemeral range, where any outgoing connection (Ray's, an engine's) may take a
    port between this check and a daemon's bind (seen: slurmd "Address already in use")."""
    ephemeral = _ephemeral_ports()
    if ephemeral.start < 20000 + NODE_PORT_SPAN:  # a machine whose ephemeral range leaves no room below it
        ephemeral = range(0)
    for _ in range(200):
        port = random.randrange(10000, 20000)
        base = random.randrange(20000, 32768 - NODE_PORT_SPAN)
        if any(p in ephemeral for p in (port, port + 1, base, base + NODE_PORT_SPAN - 1)):
            continue
        if _ports_free(range(port, port + 2)) and _ports_free(range(base, base + NODE_PORT_SPAN)):
            return port, base
    raise RuntimeError("no free ports for the local SLURM cluster")


def _client_env(run_dir: Path) -> dict[str, str]:
    # Drop SLURM_* from a surrounding job (CI may itself run under SLURM): they would steer sbatch.
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["SLURM_CONF"] = str(run_dir / "etc" / "slurm.conf")
    return env


CLUSTER_PACKAGES = ("slurmctld", "slurmd", "sbatch", "squeue", "sinfo", "scontrol", "munged", "munge", "unmunge")
"""The binaries slurm/local/install.sh installs (slurm-wlm, munge)."""


def require_cluster_packages() -> None:
    """Fail (never skip) when the local cluster cannot start here, naming what to run as root."""
    missing = [cmd for cmd in CLUSTER_PACKAGES if shutil.which(cmd) is None]
    root = subprocess.run(["bash", str(INSTALL), "--root-command"], capture_output=True, text=True, timeout=30).stdout.strip()
    if missing:
        pytest.fail(f"the local SLURM cluster's packages are not installed (missing {', '.join(missing)}); as root run: {root}")
    if os.geteuid() != 0:
        pytest.fail(f"the local SLURM cluster needs root (munged runs as the munge user); run these tests as root, "
                    f"after (as root): {root}")


def _start(run_dir: Path, *options: str) -> Cluster:
    require_cluster_packages()
    port, base = _free_ports()
    args = [str(START), str(run_dir), "--port", str(port), "--node-port-base", str(base), *options]
    proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, f"start.sh failed (run slurm/local/install.sh first?):\n{proc.stderr}"
    assert f"SLURM_CONF={run_dir}/etc/slurm.conf" in proc.stdout
    return Cluster(run_dir, _client_env(run_dir), args)


def _stop(cluster: Cluster) -> None:
    pids = cluster.daemon_pids()
    proc = subprocess.run([str(STOP), str(cluster.run_dir)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    left = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert left == [], f"stop.sh left daemons running: {left}"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One CPU node plus eight emulated 8 x H200 nodes, started once for this module."""
    run_dir = tmp_path_factory.mktemp("slurm")
    started = _start(run_dir, "--gpu-nodes", "8")
    try:
        yield started
    finally:
        _stop(started)


def _wait_for_job(cluster: Cluster, job_id: str, timeout_s: float = 60.0) -> str:
    """Poll scontrol until the job reaches a final state; return that state."""
    deadline = time.monotonic() + timeout_s
    state = "UNKNOWN"
    while time.monotonic() < deadline:
        out = cluster.run("scontrol", "show", "job", job_id).stdout
        state = out.split("JobState=", 1)[1].split()[0] if "JobState=" in out else "UNKNOWN"
        if state in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            return state
        time.sleep(0.5)
    raise AssertionError(f"job {job_id} still {state} after {timeout_s}s")


def test_batch_job_runs_and_writes_its_output_file(cluster: Cluster, tmp_path: Path) -> None:
    out = tmp_path / "result.txt"
    script = tmp_path / "job.sbatch"
    script.write_text(f'#!/bin/bash\n#SBATCH --job-name=tiny\necho "ran job $SLURM_JOB_ID on $SLURMD_NODENAME" > {out}\n')
    job_id = cluster.run("sbatch", "--parsable", "--output", str(tmp_path / "slurm-%j.out"), str(script)).stdout.strip()
    assert job_id.isdigit()
    assert _wait_for_job(cluster, job_id) == "COMPLETED"
    assert out.read_text() == f"ran job {job_id} on n1\n"


def _test_only(cluster: Cluster, tmp_path: Path, gpus_per_node: int) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "gpu.sbatch"
    script.write_text("#!/bin/bash\nnvidia-smi\n")
    return cluster.run(
        "sbatch", "--test-only", "--partition=h200", "--nodes=8", f"--gpus-per-node={gpus_per_node}", str(script), check=False
    )


def test_test_only_accepts_8_nodes_with_8_h200_each(cluster: Cluster, tmp_path: Path) -> None:
    proc = _test_only(cluster, tmp_path, gpus_per_node=8)
    assert proc.returncode == 0, proc.stderr
    assert "h200-[1-8]" in proc.stderr


def test_test_only_refuses_9_gpus_per_node(cluster: Cluster, tmp_path: Path) -> None:
    proc = _test_only(cluster, tmp_path, gpus_per_node=9)
    assert proc.returncode != 0
    assert "Requested node configuration is not available" in proc.stderr


def test_start_again_with_same_options_keeps_the_running_daemons(cluster: Cluster) -> None:
    before = sorted(cluster.daemon_pids())
    proc = subprocess.run(cluster.start_args, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert sorted(cluster.daemon_pids()) == before
    assert len(before) == 11  # munged, slurmctld, slurmd for n1 and h200-1..8


def test_start_refuses_a_different_shape_while_running(cluster: Cluster) -> None:
    proc = subprocess.run([str(START), str(cluster.run_dir), "--nodes", "3"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1
    assert "different configuration" in proc.stderr


def test_two_emulated_nodes_run_one_job_step_each_and_stop_cleanly(tmp_path: Path) -> None:
    two = _start(tmp_path / "two", "--nodes", "2")
    try:
        assert len(two.daemon_pids()) == 4  # munged, slurmctld, two slurmd
        proc = two.run("srun", "--nodes=2", "--ntasks-per-node=1", "--label", "printenv", "SLURMD_NODENAME")
        assert sorted(proc.stdout.split()) == ["0:", "1:", "n1", "n2"]
    finally:
        _stop(two)
