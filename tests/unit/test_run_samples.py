"""samples.jsonl and the validation answer files of a run, with the real loop (stand-in ranks and
engines, the real reward pool): the named fields, N a step, and a resumed run equal to an
uninterrupted one (no row lost or written twice), pipelined too."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from megatron_pc.driver.trainer import Trainer
from megatron_pc.metrics.logger import read_metrics
from megatron_pc.metrics.samples import SAMPLE_FIELDS
from standins import StandInWorkers
from test_trainer_loop import _cfg, _data

PIPELINED = ("cluster.placement=split", "training.pipelined=true", "training.tis_cap=2.0")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _train(cfg, tmp_path: Path) -> Path:
    Trainer(cfg, _data(tmp_path), StandInWorkers).run()
    return cfg.resolved_run_dir


def test_samples_jsonl_holds_n_rollouts_a_step_with_the_named_fields(tmp_path: Path) -> None:
    run = _train(_cfg(tmp_path, "pilot_commit", "logging.samples=3"), tmp_path)
    rows = _rows(run / "samples.jsonl")
    assert [r["step"] for r in rows] == [s for s in (1, 2, 3, 4) for _ in range(3)]
    assert all(tuple(r) == SAMPLE_FIELDS for r in rows)
    train = _data(tmp_path).train
    for r in rows:
        record = train[r["prompt_index"]]
        assert (r["prompt_id"], r["prompt"]) == (record.id, record.prompt)
        assert r["kind"] in ("pilot", "commit", "full") and isinstance(r["response"], str)
        assert r["correct"] == (r["response"].endswith(record.answer) and r["reward"] == 1.0)
    assert {r["kind"] for r in rows} >= {"pilot"}
    # Every validation's answers: 10 prompts x (1 sample + the greedy one), at steps 0, 2 and 4.
    assert sorted(p.name for p in (run / "validation").iterdir()) == [f"step_{s}_validation.jsonl" for s in (0, 2, 4)]
    answers = _rows(run / "validation" / "step_2_validation.jsonl")
    assert len(answers) == 20 and [a["sample"] for a in answers[:2]] == [0, "greedy"]
    assert {"step", "set", "prompt_id", "prompt", "response", "reward", "correct", "extracted", "answer"} <= set(answers[0])
    metrics = read_metrics(run / "metrics.jsonl")
    sampled = sum(a["correct"] for a in answers if a["sample"] != "greedy") / 10
    assert metrics[2]["val/validation/pass@1"] == pytest.approx(sampled) == pytest.approx(metrics[2]["val_accuracy"])
    assert {"val/validation/mean@1", "val/validation/maj@1"} <= set(metrics[2])


def test_no_samples_no_files(tmp_path: Path) -> None:
    run = _train(_cfg(tmp_path, "grpo", "logging.samples=0", "training.steps=2"), tmp_path)
    assert not (run / "samples.jsonl").exists() and not (run / "validation").exists()


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_resumed_run_writes_the_samples_of_an_uninterrupted_one(tmp_path: Path, pipelined: bool) -> None:
    extra = PIPELINED if pipelined else ()
    whole = _train(_cfg(tmp_path / "whole", "pilot_commit", *extra), tmp_path)
    # 3 steps, checkpoints at 2 and 3; the step-3 checkpoint is then lost, as in a crash after
    # step 3 wrote its samples but before its checkpoint was complete.
    cut = _train(_cfg(tmp_path / "cut", "pilot_commit", *extra, "training.steps=3"), tmp_path)
    step3 = sorted(p for p in (cut / "checkpoints").iterdir() if p.is_dir())[-1]
    assert step3.name.endswith("3")
    shutil.rmtree(step3)
    assert [r["step"] for r in _rows(cut / "samples.jsonl")][-1] == 3
    _train(_cfg(tmp_path / "cut", "pilot_commit", *extra), tmp_path)  # resumes from step 2
    assert _rows(cut / "samples.jsonl") == _rows(whole / "samples.jsonl")
    assert len(_rows(whole / "samples.jsonl")) == 4 * 4
