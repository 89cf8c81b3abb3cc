"""Metrics sinks: JSONL resume semantics, TensorBoard events, the progress bar's figures."""

from __future__ import annotations

from megatron_pc.metrics.config import LoggingConfig
from megatron_pc.metrics.logger import JsonlMetrics, open_metrics, read_metrics


def test_jsonl_resume_cuts_steps_after_the_checkpoint(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    sink = JsonlMetrics(path, resume_step=None)
    for step in (1, 2, 3):
        sink.log(step, {"reward_mean": step / 10})
    sink.close()
    with path.open("a") as f:
        f.write('{"step": 4, "rew')  # torn by a crash
    sink = JsonlMetrics(path, resume_step=2)
    sink.log(3, {"reward_mean": 0.9})
    sink.close()
    assert [(m["step"], m["reward_mean"]) for m in read_metrics(path)] == [(1, 0.1), (2, 0.2), (3, 0.9)]


def test_a_fresh_run_starts_an_empty_metrics_file(tmp_path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n')
    JsonlMetrics(path, resume_step=None).close()
    assert read_metrics(path) == []


def test_open_metrics_writes_jsonl_and_tensorboard_events(tmp_path, capsys) -> None:
    sinks = open_metrics(LoggingConfig(), tmp_path, "run", total_steps=3, resume_step=None, config={})
    sinks.log(1, {"cum_generated": 1536, "reward_mean": 0.25, "val_accuracy": float("nan")})
    sinks.close()
    assert read_metrics(tmp_path / "metrics.jsonl") == [{"step": 1, "cum_generated": 1536, "reward_mean": 0.25, "val_accuracy": None}]
    assert list((tmp_path / "tensorboard").glob("events.out.tfevents.*"))
    err = capsys.readouterr().err
    assert "rollouts=1,536" in err and "reward=0.250" in err
