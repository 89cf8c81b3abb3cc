"""`megatron-pc bench step`: real training runs per strategy, summarised from their metrics."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train_e2e import FAST  # noqa: E402  (the fast overrides of the driver tests)

from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.trace import read_trace
from benchmarks.step import rollouts_to_reach, summarise
from megatron_pc.config import load_config
from megatron_pc.metrics.logger import read_metrics

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "megatron_pc", "bench", "step", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.mark.long  # a benchmark of five real runs and a resume: about 5 min on a quiet 2-core machine; kept out of CI
def test_bench_step_runs_each_strategy_and_reports_its_accounting(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    common = ["configs/tiny_cpu.yaml", *FAST, f"model.path={tiny_model_dir}", "allocation.on_round_limit=train_partial", "training.save_every=2"]
    proc = _bench(*common, "--strategies", "pilot_commit,grpo", "--steps", "3", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout)
    comparisons = {"pilot_commit_unbound", "pilot_commit_split", "pilot_commit_pipelined"}
    assert set(result["strategies"]) == {"pilot_commit", "grpo"} | comparisons
    # Binding off: more engine calls for the same rounds; the gain is the ratio of generation seconds.
    unbound, bound = result["strategies"]["pilot_commit_unbound"], result["strategies"]["pilot_commit"]
    assert unbound["generate_calls"] > bound["generate_calls"]
    assert result["binding_gain"] == pytest.approx(unbound["phase_seconds"]["generate"] / bound["phase_seconds"]["generate"])
    # Pipelined: a real split-placement run whose rollouts are one step off-policy, and its speedup.
    piped = result["strategies"]["pilot_commit_pipelined"]
    assert piped["policy_lag"] == 1 and result["strategies"]["pilot_commit_split"]["policy_lag"] == 0
    assert result["pipelined_speedup"] == pytest.approx(result["strategies"]["pilot_commit_split"]["step_seconds"] / piped["step_seconds"])
    pipelined_dir = out / "pilot_commit_pipelined"
    rows = read_metrics(pipelined_dir / "metrics.jsonl")
    assert [r["policy_lag"] for r in rows[1:]] == [0, 1, 1]
    assert check_trace(read_trace(pipelined_dir / "trace.jsonl"), load_config(str(pipelined_dir / "config.yaml")).allocation) == []
    # Resumed from its step-2 checkpoint (step 3 already generated in it), the real pipelined run
    # continues exactly: the same metrics and the same trace.
    again = tmp_path / "pipelined_again"
    shutil.copytree(pipelined_dir, again)
    shutil.rmtree(again / "checkpoints" / "step_00000003")
    train = [sys.executable, "-m", "megatron_pc", "train", *common, "allocation.strategy=pilot_commit", f"run_dir={again}", "logging.progress=false",
             "cluster.placement=split", "training.pipelined=true", "training.steps=3"]  # fmt: skip
    resumed = subprocess.run(train, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    keys = ("generated", "cum_generated", "reward_mean", "loss", "val_accuracy", "policy_lag", "rollout_age_mean")
    assert [[r.get(k) for k in keys] for r in read_metrics(again / "metrics.jsonl")] == [[r.get(k) for k in keys] for r in rows]
    assert read_trace(again / "trace.jsonl") == read_trace(pipelined_dir / "trace.jsonl")
    # MFU of every phase of every run, a share of the measured peak.
    assert result["peak"]["flops"] > 0 and set(result["mfu"]) == set(result["strategies"])
    for name, mfu in result["mfu"].items():
        assert {"generate", "logprob", "update"} <= set(mfu), name
        assert all(0 < v < 1 for v in mfu.values()), (name, mfu)
    for name in comparisons:
        result["strategies"].pop(name)
    for name, f in result["strategies"].items():
        rows = read_metrics(out / name / "metrics.jsonl")
        assert f["steps"] == 3 and rows[-1]["step"] == 3
        assert f["rollouts"] == rows[-1]["cum_generated"] == sum(r["generated"] for r in rows if r["step"] > 0)
        assert f["trained_share"] == pytest.approx(rows[-1]["cum_trained_rollouts"] / rows[-1]["cum_generated"])
        assert [v["step"] for v in f["validation"]] == [r["step"] for r in rows if "val_accuracy" in r]
        assert 0 < f["sync_share"] < 1 and f["step_seconds"] > 0
    # GRPO generates train_batch x n every step (FAST: 8 prompts x the tiny config's n=16).
    grpo = result["strategies"]["grpo"]
    assert grpo["rollouts_per_step"] == 8 * 16 and grpo["trained_share"] == 1.0
    # The default target is reached by every strategy, by construction.
    assert all(f["rollouts_to_target"] is not None for f in result["strategies"].values())
    # A second call finds the finished runs and reads them again instead of training anew.
    again = _bench(*common, "--strategies", "grpo", "--steps", "3", "--comparisons", "none", "--out", str(out), "--json")
    assert again.returncode == 0, again.stderr[-4000:]
    assert json.loads(again.stdout)["strategies"]["grpo"]["rollouts"] == grpo["rollouts"]


def test_unknown_strategy_or_comparison_is_refused_before_any_run() -> None:
    proc = _bench("--strategies", "pilot_commit,ppo")
    assert proc.returncode == 2
    assert "--strategies: unknown ['ppo']" in proc.stderr
    proc = _bench("--comparisons", "binding,overlap")
    assert proc.returncode == 2 and "--comparisons: unknown ['overlap']; choose from binding, pipelined, or none" in proc.stderr


def _row(step: int, cum: int, acc: float | None = None) -> dict:
    row = {"step": step, "generated": 10, "cum_generated": cum, "cum_trained_rollouts": cum // 2, "time_total": 2.0,
           "time_generate": 1.0, "time_sync": 0.1, "gen_tokens_per_s": 100.0}  # fmt: skip
    return {**row, "val_accuracy": acc} if acc is not None else row


def test_rollouts_to_target_is_the_cumulative_count_at_the_first_validation_reaching_it() -> None:
    rows = [_row(0, 0, 0.40), _row(1, 10), _row(2, 20, 0.50), _row(3, 30), _row(4, 40, 0.45), _row(5, 50, 0.60)]
    f = summarise(rows)
    assert f["rollouts"] == 50 and f["trained_share"] == 0.5 and f["sync_share"] == pytest.approx(0.05)
    assert rollouts_to_reach(f["validation"], 0.5) == 20
    assert rollouts_to_reach(f["validation"], 0.55) == 50
    assert rollouts_to_reach(f["validation"], 0.7) is None
