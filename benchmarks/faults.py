"""``megatron-pc bench faults``: inject every fault of the fault suite, try bad input, count.

    megatron-pc bench faults [CONFIG] [overrides...] [--quick] [--out DIR] [--json]

**Runs** (skipped by ``--quick``): real ``megatron-pc train`` runs of CONFIG (default: the tiny
CPU configuration, made small: 8 prompts a step, a checkpoint after every step) on this
machine's Ray, Megatron-Core and vLLM:

* an uninterrupted reference run;
* one run directory restarted after each of these, in turn: the driver SIGKILLed in each
  phase of a step (generate, reward, logprob, update, sync, validation, checkpoint write),
  then SIGTERMed in each phase, then SIGTERMed twice in one step. A SIGKILLed run must leave
  only complete checkpoints; a SIGTERMed one must checkpoint and exit 75, within the SLURM
  grace period of ``slurm/pc_tiny_cpu.sbatch``. Its final metrics and trace must equal the
  reference's: same rollout counts, rewards and losses, step by step;
* a rollout engine SIGKILLed mid-run (restarted, the run goes on) and a policy rank SIGKILLed
  (the run stops naming it, a restart resumes); both must end equal to the reference;
* the newest checkpoint damaged before a restart (resumes from the previous one);
* the disk filled during a checkpoint (a small tmpfs: where mounting is not permitted the
  case is reported as not run);
* a worker node lost in step 2, on two emulated Ray nodes (benchmarks/nodes.py): the run must
  exit with the requeue code and the same command, on a node that replaces it, end equal to a
  two-node reference.

**Offline** (always): damaged checkpoints of every kind, a file-size limit hit while saving,
reward workers that crash or hang, and bad input: configs, data files, model directories and
hostile model output against the reward. A bad input counts as refused when our own error
names the culprit (field, file, tensor) and nothing was written.

Figures: ``faults_injected``, ``faults_survived``, ``bad_inputs_tried``, ``bad_inputs_refused``,
``rollouts_lost``, ``checkpoints_lost`` (the last two must be 0), and every case with its
verdict; ``--out`` keeps the run directories and writes ``faults.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from megatron_pc.driver.checkpoints import CheckpointManager, verify
from megatron_pc.driver.faults import ENV, Fault
from megatron_pc.errors import MegatronPCError
from megatron_pc.metrics.phases import FAULT_PHASES

ROOT = Path(__file__).resolve().parents[1]  # the repository (benchmarks/ is top level)

SMALL = [
    "allocation.train_batch=8", "allocation.pilot.batch=24", "allocation.dapo_batch=8", "training.mini_batch=8",
    "data.train_size=400", "data.validation_size=48", "training.val_samples=2", "training.validate_every=2",
    "training.save_every=1", "allocation.on_round_limit=train_partial", "logging.progress=false",
    "logging.tensorboard=false",
]  # fmt: skip
"""What the runs add to CONFIG: small steps, validation every 2 steps, a checkpoint every step."""

COMPARED = ("cum_generated", "generated_pilot", "generated_commit", "generated_full", "trained_rollouts",
            "reward_mean", "loss", "val_accuracy")  # fmt: skip
"""Metrics a restarted run must share with the uninterrupted one, step by step."""

TINY_GRACE_S = 60.0
"""``#SBATCH --signal=B:USR1@60`` in slurm/pc_tiny_cpu.sbatch: the checkpoint must be written
and the job gone within this many seconds of the signal."""


@dataclass
class Case:
    """One fault or bad input and what became of it."""

    kind: str  # "fault" or "bad_input"
    name: str
    ok: bool
    detail: str = ""


@dataclass
class Tally:
    """The suite's figures."""

    cases: list[Case] = field(default_factory=list)
    rollouts_lost: int = 0
    checkpoints_lost: int = 0
    not_run: list[str] = field(default_factory=list)
    grace_s: list[float] = field(default_factory=list)

    def add(self, kind: str, name: str, ok: bool, detail: str = "") -> None:
        self.cases.append(Case(kind, name, bool(ok), detail))
        logging.getLogger(__name__).info("%-9s %-58s %s %s", kind, name, "ok" if ok else "FAILED", detail)

    def summary(self) -> dict[str, Any]:
        faults = [c for c in self.cases if c.kind == "fault"]
        bad = [c for c in self.cases if c.kind == "bad_input"]
        return {
            "faults_injected": len(faults), "faults_survived": sum(c.ok for c in faults),
            "bad_inputs_tried": len(bad), "bad_inputs_refused": sum(c.ok for c in bad),
            "rollouts_lost": self.rollouts_lost, "checkpoints_lost": self.checkpoints_lost,
            "max_sigterm_to_exit_s": max(self.grace_s) if self.grace_s else None, "grace_period_s": TINY_GRACE_S,
            "not_run": self.not_run, "failed": [f"{c.name}: {c.detail}" for c in self.cases if not c.ok],
            "cases": [asdict(c) for c in self.cases],
        }  # fmt: skip


# ---- launching runs ---------------------------------------------------------------------


@dataclass
class Launch:
    code: int
    seconds: float
    output: str
    signalled_at: list[float]  # wall-clock times the injector logged its signals
    ended: float  # wall-clock time the command was seen to exit


def train_command(run_dir: Path, args: list[str]) -> list[str]:
    """``megatron-pc train ARGS run_dir=RUN_DIR`` as a command line."""
    return [sys.executable, "-m", "megatron_pc", "train", *args, f"run_dir={run_dir}"]


def train(run_dir: Path, args: list[str], faults: list[Fault] = (), timeout: float = 900) -> Launch:
    """``megatron-pc train ARGS run_dir=RUN_DIR`` with ``faults`` injected; waits for it."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", ENV: ",".join(f.spec() for f in faults)}
    cmd = train_command(run_dir, args)
    log = run_dir / "train.log"
    offset = log.stat().st_size if log.exists() else 0  # train.log grows across restarts
    start = time.time()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env)
    return Launch(proc.returncode, time.time() - start, proc.stdout + proc.stderr, _signal_times(log, offset), time.time())


def _signal_times(log: Path, offset: int) -> list[float]:
    """When the injector sent its signals, from what this launch added to ``log``."""
    if not log.exists():
        return []
    with log.open("rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    return [float(t) for t in re.findall(r"injecting fault \S+ at (\d+\.\d+)", text)]


def actor_pid(title: str, run_dir: Path) -> int:
    """The process of this run's one Ray actor named ``title`` (``ray::EngineActor``,
    ``ray::MegatronRank``): its environment names the run's log file."""
    pids = []
    for pid in subprocess.run(["pgrep", "-f", title], capture_output=True, text=True).stdout.split():
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if str((run_dir / "train.log").resolve()).encode() in env:
            pids.append(int(pid))
    if len(pids) != 1:
        raise RuntimeError(f"expected one {title} process of {run_dir}, found {pids}")
    return pids[0]


def kill_actor_when(cmd: list[str], run_dir: Path, title: str, ready: Callable[[], bool], timeout: float = 900) -> tuple[int, str]:
    """Run ``cmd``; once ``ready()``, SIGKILL the run's actor ``title``; (exit code, output)."""
    return act_when(cmd, ready, lambda: os.kill(actor_pid(title, run_dir), signal.SIGKILL), timeout)


def act_when(cmd: list[str], ready: Callable[[], bool], act: Callable[[], None], timeout: float = 900) -> tuple[int, str]:
    """Run ``cmd``; once ``ready()``, ``act()`` (kill something); (exit code, output)."""
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and proc.poll() is None and not ready():
            time.sleep(0.2)
        if proc.poll() is None:
            act()
        out, _ = proc.communicate(timeout=timeout)
        return proc.returncode, out
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def kill_actor_after_step_1(cmd: list[str], run_dir: Path, title: str, timeout: float = 900) -> tuple[int, str]:
    """Run ``cmd``; once step 1's checkpoint is complete, SIGKILL the run's actor ``title``
    (it is then in step 2, or its checkpoint); (exit code, output)."""
    manifest = run_dir / "checkpoints" / "step_00000001" / "MANIFEST.json"
    return kill_actor_when(cmd, run_dir, title, manifest.is_file, timeout)


def log_grows_with(run_dir: Path, text: str) -> Callable[[], bool]:
    """A ``ready`` for :func:`kill_actor_when`: true once train.log gains a line holding ``text``
    (from now on: the log of earlier launches does not count)."""
    log = run_dir / "train.log"
    offset = log.stat().st_size if log.exists() else 0

    def ready() -> bool:
        if not log.exists():
            return False
        with log.open("rb") as f:
            f.seek(offset)
            return text.encode() in f.read()

    return ready


def differences(run: Path, reference: Path) -> tuple[list[str], int]:
    """How ``run`` differs from ``reference`` (metrics step by step, then the trace), and the
    rollouts its accounting lost or counted twice."""
    from megatron_pc.allocation.trace import read_trace
    from megatron_pc.metrics.logger import read_metrics

    a = {r["step"]: r for r in read_metrics(reference / "metrics.jsonl")}
    b = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")} if (run / "metrics.jsonl").exists() else {}
    out = [] if sorted(a) == sorted(b) else [f"steps {sorted(b)} instead of {sorted(a)}"]
    for step in sorted(set(a) & set(b)):
        bad = [k for k in COMPARED if a[step].get(k) != b[step].get(k)]
        if bad:
            out.append(f"step {step}: " + ", ".join(f"{k} {b[step].get(k)} != {a[step].get(k)}" for k in bad))
    last_a, last_b = a.get(max(a), {}), b.get(max(b), {}) if b else {}
    lost = abs(int(last_a.get("cum_generated", 0)) - int(last_b.get("cum_generated", 0)))
    lost += sum(abs(int(a[s].get("trained_rollouts") or 0) - int(b.get(s, {}).get("trained_rollouts") or 0)) for s in a)
    if (run / "trace.jsonl").exists() and read_trace(run / "trace.jsonl") != read_trace(reference / "trace.jsonl"):
        out.append("the trace differs")
    return out, lost


def _checkpoints(run_dir: Path) -> tuple[int, list[str]]:
    """(newest complete step, the step directories that are not complete)."""
    root = run_dir / "checkpoints"
    dirs = [p for p in root.iterdir() if re.fullmatch(r"step_\d{8}", p.name)] if root.is_dir() else []
    broken = [p.name for p in dirs if verify(p) is not None]
    complete = [int(p.name[5:]) for p in dirs if p.name not in broken]
    return max(complete, default=0), broken


# ---- the runs ---------------------------------------------------------------------------


CHAIN_STEPS = 9
"""Steps of the chain's runs: step 2 for the SIGKILLs, one step per SIGTERM case, then the last."""

SIGTERM_AT = {"generate": 2, "reward": 3, "logprob": 4, "update": 5, "validation": 6, "sync": 7, "checkpoint": 8}
"""The step of each SIGTERM case: one more step each, validation on an even step (validate_every 2)."""


def chain() -> list[tuple[list[Fault], int]]:
    """The restarts of one run directory: (faults of the launch, its expected exit code).

    Every SIGKILL lands in step 2 (the newest checkpoint is step 1's, so each restart redoes
    step 2, a delay putting some of them inside their phase rather than at its start); then each
    SIGTERM lets one more step finish; then two SIGTERMs in the last step."""
    delays = {"generate": 0.3, "update": 0.05, "validation": 0.2}
    kills = [([Fault("sigkill", p, 2, delays.get(p, 0.0))], -signal.SIGKILL) for p in FAULT_PHASES]
    terms = [([Fault("sigterm", p, step)], 75) for p, step in SIGTERM_AT.items()]
    twice = ([Fault("sigterm", "generate", CHAIN_STEPS), Fault("sigterm", "update", CHAIN_STEPS, 0.05)], 75)
    return kills + terms + [twice]


def run_faults(args: list[str], out: Path, tally: Tally) -> None:
    """The real runs: the reference, the restart chain, engine and rank kills, damage, a full disk."""
    args = [*args, *SMALL, f"training.steps={CHAIN_STEPS}"]
    ref = out / "reference"
    launch = train(ref, args)
    if launch.code != 0:
        raise MegatronPCError(f"the reference run failed (exit {launch.code}); nothing to compare with:\n{launch.output[-3000:]}")

    run = out / "restarted"
    results = []
    for faults, expected in chain():
        newest_before, _ = _checkpoints(run)
        launch = train(run, args, faults)
        newest, broken = _checkpoints(run)
        lost = int(newest < newest_before) + len(broken)
        tally.checkpoints_lost += lost
        detail = f"exit {launch.code} (expected {expected}), newest checkpoint {newest_before} -> {newest}"
        ok = launch.code == expected and not lost and len(launch.signalled_at) >= len(faults)
        if expected == 75 and launch.signalled_at:
            grace = launch.ended - launch.signalled_at[0]
            tally.grace_s.append(grace)
            detail += f", signal to exit {grace:.1f} s"
            ok = ok and grace < TINY_GRACE_S
        if broken:
            detail += f", incomplete checkpoint directories {broken}"
        results.append((faults, ok, detail))
    final = train(run, args)
    diffs, rollouts_lost = differences(run, ref)
    tally.rollouts_lost += rollouts_lost
    same = final.code == 0 and not diffs
    for faults, ok, detail in results:
        name = "driver " + " + ".join(f.spec() for f in faults)
        tally.add("fault", name, ok and same, detail + ("" if same else f"; the finished run differs: {diffs[:3]}"))

    for title, what, expect in (("ray::EngineActor", "rollout engine", 0), ("ray::MegatronRank", "policy rank", 2)):
        d = out / title.split("::")[1].lower()
        code, output = kill_actor_after_step_1(train_command(d, args), d, title)
        detail = f"exit {code} (expected {expect})"
        ok = code == expect
        if expect:  # the run stopped: the same command must resume it
            ok = ok and "died during" in output and "Run the same command again to resume" in output
            _, broken = _checkpoints(d)
            tally.checkpoints_lost += len(broken)
            ok = ok and not broken and train(d, args).code == 0
        diffs, lost = differences(d, ref)
        tally.rollouts_lost += lost
        tally.add("fault", f"{what} SIGKILLed in step 2", ok and not diffs, detail + (f"; differs: {diffs[:3]}" if diffs else ""))

    damaged = out / "damaged"
    shutil.copytree(ref, damaged)
    newest = max((damaged / "checkpoints").iterdir())
    _flip(next(p for p in sorted((newest / "policy").rglob("*")) if p.is_file() and p.stat().st_size > 64))
    launch = train(damaged, args)
    diffs, lost = differences(damaged, ref)
    tally.rollouts_lost += lost
    tally.add("fault", "a flipped byte in the newest checkpoint's policy, then restart",
              launch.code == 0 and "skipping damaged checkpoint" in launch.output and not diffs,
              f"exit {launch.code}" + (f"; differs: {diffs[:3]}" if diffs else ""))  # fmt: skip
    _disk_full_run(args, out, ref, tally)
    lost_node_fault(args, out, tally)


# ---- a lost node, on two emulated Ray nodes (benchmarks/nodes.py) ----------------------------

TWO_NODES = ["cluster.data_parallel=2", "rollout.engines=2", "cluster.cpus_per_worker=1"]
"""What a run adds to spread over two emulated nodes of one CPU each: a policy rank and an
engine on each (one CPU bundle a node)."""


def lost_node_fault(args: list[str], out: Path, tally: Tally) -> None:
    """Two emulated nodes: a reference run, then the same run with node 1 lost in step 2 (after
    step 1's checkpoint): it must exit with the requeue code, keep its complete checkpoints, and
    the same command on a replacement node must end equal to the reference."""
    from benchmarks.nodes import emulated_nodes
    from megatron_pc.driver.train import PREEMPTED_EXIT

    args = [*args, *TWO_NODES]
    with emulated_nodes(2, cpus=1) as nodes:
        here = [*args, f"cluster.ray_address={nodes.address}"]
        ref, run = out / "two_nodes_reference", out / "two_nodes_lost"
        if subprocess.run(train_command(ref, here), capture_output=True, text=True).returncode != 0:
            tally.add("fault", "a worker node lost in step 2", False, "the two-node reference run failed")
            return
        manifest = run / "checkpoints" / "step_00000001" / "MANIFEST.json"
        start = time.monotonic()
        code, output = act_when(train_command(run, here), manifest.is_file, lambda: nodes.kill(1), timeout=1200)
        stopped_s = time.monotonic() - start
        newest, broken = _checkpoints(run)
        tally.checkpoints_lost += len(broken) + int(newest < 1)
        nodes.add(cpus=1)  # the requeued job's allocation
        resumed = subprocess.run(train_command(run, here), capture_output=True, text=True)
        diffs, lost = differences(run, ref)
        tally.rollouts_lost += lost
        ok = code == PREEMPTED_EXIT and "node lost" in output and not broken and resumed.returncode == 0 and not diffs
        tally.add("fault", "a worker node lost in step 2 (raylet, policy rank, engine), resumed on a new node", ok,
                  f"exit {code} (expected {PREEMPTED_EXIT}) {stopped_s:.0f} s after the start, then {resumed.returncode}"
                  + (f"; differs: {diffs[:3]}" if diffs else ""))  # fmt: skip


def _flip(path: Path, at: int = 40) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def _disk_full_run(args: list[str], out: Path, ref: Path, tally: Tally) -> None:
    """A run on a small tmpfs that a filler file makes full after step 1's checkpoint."""
    mount = out / "small_disk"
    mount.mkdir(exist_ok=True)
    size_mb = max(64, 4 * _size_mb(ref / "checkpoints") // 2 + 32)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(mount)], capture_output=True, text=True)
    if made.returncode != 0:
        tally.not_run.append(f"disk full during a real run: mount of a tmpfs refused ({made.stderr.strip()}); "
                             "the offline case (a file-size limit) stands in")  # fmt: skip
        return
    try:
        run = mount / "run"
        proc = subprocess.Popen(train_command(run, args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while proc.poll() is None and not (run / "checkpoints" / "step_00000001" / "MANIFEST.json").is_file():
            time.sleep(0.1)
        filler = mount / "filler"
        free = shutil.disk_usage(mount).free
        with filler.open("wb") as f:  # leave 256 KiB: metrics and logs fit, a checkpoint does not
            f.write(b"\0" * max(0, free - (256 << 10)))
        output, _ = proc.communicate(timeout=900)
        newest, broken = _checkpoints(run)
        tmp_left = list((run / "checkpoints").glob("*.tmp"))
        ok = proc.returncode == 2 and "the disk is full" in output and newest >= 1 and not broken and not tmp_left
        tally.checkpoints_lost += len(broken)
        detail = f"exit {proc.returncode}, newest complete checkpoint {newest}, leftovers {[p.name for p in tmp_left]}"
        said = [line for line in output.splitlines() if "could not be written" in line]
        detail += f"; {said[-1].strip()[:400]}" if said else f"; output: {output.strip()[-600:]}"
        filler.unlink()
        resumed = train(run, args)
        diffs, lost = differences(run, ref)
        tally.rollouts_lost += lost
        tally.add("fault", "the disk fills during a checkpoint (tmpfs), then space is freed and the run restarted",
                  ok and resumed.code == 0 and not diffs, detail + (f"; differs: {diffs[:3]}" if diffs else ""))  # fmt: skip
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _size_mb(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) >> 20


# ---- offline cases ----------------------------------------------------------------------


def offline(tally: Tally, work: Path) -> None:
    """Damaged checkpoints, a save past a file-size limit, reward faults, and bad input."""
    _damaged_checkpoints(tally, work / "ckpt")
    _file_size_limit(tally, work / "fsize")
    _reward_faults(tally)
    from benchmarks import faults_inputs

    faults_inputs.bad_inputs(tally, work / "inputs")


def policy_writer(blob: bytes) -> Callable[[Path], None]:
    """A stand-in for the policy's checkpoint writer: a shard holding ``blob`` and a metadata file."""

    def write(path: Path) -> None:
        (path / "shards").mkdir(parents=True)
        (path / "shards" / "0.distcp").write_bytes(blob)
        (path / "metadata.json").write_text('{"layout": [1, 1, 1]}')

    return write


DAMAGE: dict[str, Callable[[Path], None]] = {
    "a truncated policy shard": lambda c: (c / "policy/shards/0.distcp").write_bytes((c / "policy/shards/0.distcp").read_bytes()[:100]),
    "a flipped byte in a policy shard": lambda c: _flip(c / "policy/shards/0.distcp"),
    "a flipped byte in controller.json": lambda c: _flip(c / "controller.json", 5),
    "a missing manifest": lambda c: (c / "MANIFEST.json").unlink(),
    "a garbled manifest": lambda c: (c / "MANIFEST.json").write_text('{"files": 7'),
    "a missing policy file": lambda c: (c / "policy/metadata.json").unlink(),
}


def _damaged_checkpoints(tally: Tally, work: Path) -> None:
    for name, damage in DAMAGE.items():
        root = work / re.sub(r"\W+", "_", name)
        mgr = CheckpointManager(root, keep=2)
        mgr.save(1, {"step": 1}, policy_writer(os.urandom(4096)))
        newest = mgr.save(2, {"step": 2}, policy_writer(os.urandom(4096)))
        damage(newest)
        found, message = _capture_warnings(mgr.latest)
        ok = found is not None and found[0] == 1 and "skipping damaged checkpoint" in message
        tally.add("fault", f"checkpoint damage: {name}", ok, message.strip().splitlines()[-1][:160] if message else "no warning")
        if found is None:
            tally.checkpoints_lost += 1


def _capture_warnings(call: Callable[[], Any]) -> tuple[Any, str]:
    """``call()`` and what the checkpoint manager logged meanwhile."""
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    log = logging.getLogger("megatron_pc.driver.checkpoints")
    log.addHandler(handler)
    try:
        return call(), buf.getvalue()
    finally:
        log.removeHandler(handler)


SAVE_PAST_LIMIT = """
import resource, signal, sys
from pathlib import Path
from megatron_pc.driver.checkpoints import CheckpointManager, CheckpointWriteError
def policy(content):
    def write(path):
        path.mkdir()
        (path / "shard.bin").write_bytes(content)
    return write
mgr = CheckpointManager(sys.argv[1])
mgr.save(2, {"step": 2}, policy(b"good"))
# From here on no file may grow past 64 KiB: the kernel refuses the write (EFBIG), as a full
# disk refuses it with ENOSPC.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, resource.RLIM_INFINITY))
try:
    mgr.save(4, {"step": 4}, policy(b"x" * (1 << 20)))
except CheckpointWriteError as err:
    print(err)
"""


def _file_size_limit(tally: Tally, work: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run([sys.executable, "-c", SAVE_PAST_LIMIT, str(work)], capture_output=True, text=True, timeout=120)
    left = sorted(p.name for p in (work / "checkpoints").iterdir())
    ok = proc.returncode == 0 and "could not be written" in proc.stdout and left == ["step_00000002"]
    tally.add("fault", "a checkpoint write refused by the filesystem (file-size limit)", ok, f"left {left}; {proc.stdout.strip()[:120]}")
    tally.checkpoints_lost += "step_00000002" not in left


def _reward_faults(tally: Tally) -> None:
    from megatron_pc.reward import RewardConfig, RewardPool

    with RewardPool(RewardConfig(function="math_verify", workers=2, timeout_s=1.0)) as pool:
        # A hang: an item that runs past the timeout is killed, graded 0, its worker replaced.
        result = pool.score(["\\boxed{9^{9^{9^{9}}}}", "\\boxed{2}"], ["1", "2"])
        ok = result[0].reason == "timeout" and result[1].correct and pool.alive_workers() == 2
        tally.add("fault", "a reward worker hangs on an item", ok, f"reasons {[r.reason for r in result]}")
        # A crash: the worker grading an item is SIGKILLed mid-item.
        victim = pool._workers[0].process.pid
        threading.Timer(0.3, os.kill, (victim, signal.SIGKILL)).start()
        result = pool.score(["\\boxed{9^{9^{9^{9}}}}"], ["1"])
        after = pool.score(["\\boxed{3}"], ["3"])
        ok = result[0].reason == "worker_died" and result[0].reward == 0.0 and after[0].correct and pool.alive_workers() == 2
        tally.add("fault", "a reward worker dies mid-item", ok, f"reason {result[0].reason}, pool healthy {pool.alive_workers() == 2}")


# ---- the command ------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="megatron-pc bench faults", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("config", nargs="?", help="experiment YAML (default: the embedded tiny CPU configuration)")
    parser.add_argument("overrides", nargs="*", help="dotted overrides for the runs")
    parser.add_argument("--quick", action="store_true", help="offline cases only (no training runs): seconds, not minutes")
    parser.add_argument("--out", type=Path, help="keep the run directories here and write faults.json")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stderr)
    out = args.out or Path(tempfile.mkdtemp(prefix="megatron-pc-faults-"))
    out.mkdir(parents=True, exist_ok=True)
    tally = Tally()
    start = time.time()
    offline(tally, out / "offline")
    if args.quick:
        tally.not_run.append("the training runs (--quick)")
    else:
        train_args = ([args.config] if args.config else []) + args.overrides
        run_faults(train_args, out, tally)
    summary = tally.summary()
    summary["seconds"] = round(time.time() - start, 1)
    (out / "faults.json").write_text(json.dumps(summary, indent=1) + "\n")
    if args.json:
        print(json.dumps({k: v for k, v in summary.items() if k != "cases"}, indent=1))
    else:
        print(_table(summary))
    if not args.out:
        shutil.rmtree(out, ignore_errors=True)
    lost = summary["rollouts_lost"] or summary["checkpoints_lost"]
    return 1 if summary["failed"] or lost else 0


def _table(s: dict[str, Any]) -> str:
    lines = [
        f"faults injected   {s['faults_injected']:4d}   survived {s['faults_survived']}",
        f"bad inputs tried  {s['bad_inputs_tried']:4d}   refused cleanly {s['bad_inputs_refused']}",
        f"rollouts lost     {s['rollouts_lost']:4d}   checkpoints lost {s['checkpoints_lost']}",
    ]
    if s["max_sigterm_to_exit_s"] is not None:
        lines.append(f"SIGTERM to exit   {s['max_sigterm_to_exit_s']:.1f} s at most (grace period {s['grace_period_s']:.0f} s)")
    lines += [f"not survived: {f}" for f in s["failed"]] + [f"not run: {n}" for n in s["not_run"]]
    return "\n".join(lines)
