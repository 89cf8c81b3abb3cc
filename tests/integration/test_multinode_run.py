"""The tiny run over two emulated Ray nodes (benchmarks/nodes.py: a raylet and a loopback address
each, one CPU each, a head that holds nothing): the policy's DP 2 crosses the nodes (its gloo
groups meet at rank 0's node), each node has an engine, the sync check passes. Then node 1 is
lost in step 2: the run exits with the requeue code, and the same command on a node that
replaces it resumes from step 1's checkpoint and ends as the uninterrupted run."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from benchmarks.faults import differences  # noqa: E402
from benchmarks.nodes import EmulatedNodes, emulated_nodes  # noqa: E402
from megatron_pc.allocation.check import check_trace  # noqa: E402
from megatron_pc.allocation.trace import read_trace  # noqa: E402
from megatron_pc.config import load_config  # noqa: E402
from megatron_pc.driver.checkpoints import verify  # noqa: E402
from megatron_pc.driver.train import PREEMPTED_EXIT  # noqa: E402
from megatron_pc.metrics.logger import read_metrics  # noqa: E402
from test_train_e2e import FAST  # noqa: E402

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
STEPS = 3


@pytest.fixture(scope="module")
def two_nodes() -> Iterator[EmulatedNodes]:
    with emulated_nodes(2, cpus=1) as nodes:
        yield nodes


def _args(model: Path, run: Path, nodes: EmulatedNodes) -> list[str]:
    return [sys.executable, "-m", "megatron_pc", "train", *FAST, f"run_dir={run}", f"model.path={model}", f"training.steps={STEPS}",
            "training.save_every=1", "allocation.on_round_limit=train_partial", "cluster.data_parallel=2", "rollout.engines=2",
            "cluster.cpus_per_worker=1", f"cluster.ray_address={nodes.address}"]  # fmt: skip


def _actors_by_node() -> dict[str, set[str]]:
    """Ray's record of every actor this cluster ran (dead ones too): class -> node addresses."""
    out: dict[str, set[str]] = {}
    for actor in ray._private.state.actors().values():  # the GCS's actor table; the state API needs the dashboard
        out.setdefault(actor["ActorClassName"], set()).add(actor["Address"]["IPAddress"])
    return out


@pytest.fixture(scope="module")
def straight(two_nodes: EmulatedNodes, tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, set[str]], float]:
    """The uninterrupted run: its directory, where its actors ran, its seconds."""
    run = tmp_path_factory.mktemp("straight") / "run"
    start = time.monotonic()
    proc = subprocess.run(_args(tiny_model, run, two_nodes), cwd=ROOT, capture_output=True, text=True, timeout=1200,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    seconds = time.monotonic() - start
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    ray.init(address=two_nodes.address, log_to_driver=False)
    try:
        placed = _actors_by_node()
    finally:
        ray.shutdown()
    return run, placed, seconds


def test_a_run_whose_policy_and_engines_span_two_nodes_trains_and_its_sync_check_passes(
        two_nodes: EmulatedNodes, straight: tuple[Path, dict[str, set[str]], float]) -> None:  # fmt: skip
    run, placed, _ = straight
    both = {two_nodes.ip(0), two_nodes.ip(1)}
    assert placed["MegatronRank"] == both and placed["EngineActor"] == both  # a rank and an engine on each node
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(STEPS + 1))
    assert all(r["logprob_gap"] <= 0.05 for r in rows[1:])  # the engines hold the weights the policy trained
    assert check_trace(read_trace(run / "trace.jsonl"), load_config(str(run / "config.yaml")).allocation) == []


@pytest.mark.long  # two more runs (the lost one, the resume): ~5 min on a quiet machine; `bench faults` runs it too
def test_a_node_lost_in_step_2_exits_for_a_requeue_and_the_same_command_on_a_new_node_resumes_it_exactly(
        two_nodes: EmulatedNodes, tiny_model: Path, straight: tuple[Path, dict[str, set[str]], float], tmp_path: Path) -> None:  # fmt: skip
    run = tmp_path / "run"
    cmd = _args(tiny_model, run, two_nodes)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    manifest = run / "checkpoints" / "step_00000001" / "MANIFEST.json"
    try:
        deadline = time.monotonic() + 1200
        while time.monotonic() < deadline and proc.poll() is None and not manifest.is_file():
            time.sleep(0.2)
        assert proc.poll() is None, proc.communicate()[0][-3000:]
        two_nodes.kill(1)  # in step 2: its policy rank and engine go with it
        out, _ = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == PREEMPTED_EXIT, out[-4000:]
    assert "node lost" in out and two_nodes.ip(1) in out
    complete = sorted(p.name for p in (run / "checkpoints").iterdir() if verify(p) is None)
    assert complete == ["step_00000001"]
    # The requeued job: a new node in place of the lost one, the same command.
    two_nodes.add(cpus=1)
    again = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1200, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    diffs, lost = differences(run, straight[0])
    assert diffs == [] and lost == 0
