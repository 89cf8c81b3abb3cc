"""W&B for real: the wandb package in offline mode, its run files read back record by record.

The e2e test is also the one that trains from verl-format parquet files (a training source and a
validation set, chat messages rendered by the model's chat template): one tiny run covers both.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from megatron_pc.data.arithmetic import arithmetic_prompts
from megatron_pc.metrics.config import LoggingConfig
from megatron_pc.metrics.logger import WANDB_ID_FILE, WandbMetrics, read_metrics, wandb_naming
from megatron_pc.metrics.samples import SampleLog

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]

_BLOCK = 32768  # the .wandb file is a LevelDB-style log: 32 KiB blocks of framed chunks
_HEADER = 7  # ":W&B", a 2-byte magic and a version byte


def _chunks(data: bytes) -> Iterator[bytes]:
    """The records of a .wandb file. wandb 0.31 ships no Python reader (its Go core writes the
    file), so the framing is undone here and each record parsed with wandb's own protobuf."""
    assert data[:4] == b":W&B", "not a .wandb transaction log"
    pos, pending = _HEADER, b""
    while pos + 7 <= len(data):
        if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a chunk header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        payload, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:  # a whole record
            yield payload
        elif kind == 2:  # first, middle, last part of a record split over blocks
            pending = payload
        elif kind == 3:
            pending += payload
        elif kind == 4:
            yield pending + payload


def _records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    records = []
    for chunk in _chunks(path.read_bytes()):
        record = pb.Record()
        record.ParseFromString(chunk)
        records.append(record)
    return records


def _finished_records(path: Path, timeout_s: float = 120.0) -> list[Any]:
    """The records of a run file once W&B has written its last (``exit``) record. ``finish()``
    returns before wandb's core service has flushed the file, so a read right after it can see
    a prefix of the run (seen here: no run record, or the last steps' history missing)."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = _records(path)
        if records and records[-1].WhichOneof("record_type") == "exit":
            return records
        if time.monotonic() > deadline:
            kinds = [r.WhichOneof("record_type") for r in records]
            raise AssertionError(f"{path}: no exit record after {timeout_s:.0f} s; records so far: {kinds}")
        time.sleep(0.5)


def read_offline_runs(wandb_dir: Path, expected: int) -> list[dict[str, Any]]:
    """The ``expected`` offline runs under ``wandb_dir`` in start order, each once complete: its
    id, config and history by step."""
    deadline = time.monotonic() + 60
    while len(paths := sorted(wandb_dir.glob("wandb/offline-run-*/run-*.wandb"))) < expected and time.monotonic() < deadline:
        time.sleep(0.5)
    assert len(paths) == expected, f"{len(paths)} offline W&B runs under {wandb_dir}, expected {expected}: {paths}"
    runs = []
    for path in paths:
        run: dict[str, Any] = {"id": None, "config": {}, "history": {}}
        for record in _finished_records(path):
            kind = record.WhichOneof("record_type")
            if kind == "run":
                run["id"] = record.run.run_id
                run["naming"] = (record.run.display_name, record.run.run_group, list(record.run.tags))
                run["config"] = {item.key: json.loads(item.value_json) for item in record.run.config.update}
            elif kind == "history":
                items = {"/".join(item.nested_key) or item.key: json.loads(item.value_json) for item in record.history.item}
                # A step's row may come in more than one record: merge them.
                run["history"].setdefault(record.history.step.num, {}).update({k: v for k, v in items.items() if not k.startswith("_")})
        runs.append(run)
    return runs


@pytest.fixture()
def offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """WANDB_MODE=offline with W&B's files in the test's directory. wandb reads the environment
    once per process, so its singleton is torn down after the test for the next one's directory."""
    import wandb

    wandb_dir = tmp_path / "wandb_dir"
    wandb_dir.mkdir()
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(wandb_dir))
    monkeypatch.setenv("WANDB_SILENT", "true")
    yield wandb_dir
    wandb.teardown()


def test_a_resumed_run_logs_to_the_same_wandb_run_and_carries_on_from_its_step(offline: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    first = WandbMetrics("mpc-test", "tiny", run_dir, {"seed": 3})
    for step in (0, 1, 2):
        first.log(step, {"reward_mean": 0.25 * step, "val_accuracy_stderr": None, "nan": float("nan"), "cum_generated": 10 * step})
    first.close()
    # The next attempt of the same run directory (after a preemption): the same W&B run id.
    second = WandbMetrics("mpc-test", "tiny", run_dir, {"seed": 3})
    second.log(3, {"reward_mean": 0.75, "cum_generated": 30})
    second.close()
    assert first.run_id == second.run_id == (run_dir / WANDB_ID_FILE).read_text().strip()
    runs = read_offline_runs(offline, 2)
    assert [r["id"] for r in runs] == [first.run_id, first.run_id]
    assert runs[0]["config"]["seed"] == 3
    assert runs[0]["history"] == {0: {"reward_mean": 0.0, "cum_generated": 0}, 1: {"reward_mean": 0.25, "cum_generated": 10},
                                  2: {"reward_mean": 0.5, "cum_generated": 20}}  # fmt: skip
    assert runs[1]["history"] == {3: {"reward_mean": 0.75, "cum_generated": 30}}
    # Another run directory is another W&B run.
    other = WandbMetrics("mpc-test", "tiny", tmp_path / "other", {})
    other.close()
    assert other.run_id != first.run_id


def test_a_run_is_named_grouped_and_tagged_and_its_samples_go_to_tables(offline: Path, tmp_path: Path) -> None:
    naming = wandb_naming(LoggingConfig(), "tiny_cpu", "grpo", 3, "/models/start_model")
    sink = WandbMetrics("mpc-test", "tiny_cpu", tmp_path / "run", {}, naming)
    samples = SampleLog(tmp_path / "run" / "samples.jsonl", None, sink)
    rows = [{"step": 1, "prompt_id": "p0", "prompt": [{"role": "user", "content": "1+1"}], "response": "2", "reward": 1.0, "correct": True}]
    answers = [{"step": 1, "set": "sums", "sample": 0, "response": "3", "extracted": "3", "correct": False},
               {"step": 1, "set": "sums", "sample": "greedy", "response": "", "extracted": None, "correct": False}]  # mixed types
    samples.write(1, rows, {"sums": answers})
    sink.log(1, {"reward_mean": 0.5})
    samples.close()
    sink.close()
    (run,) = read_offline_runs(offline, 1)
    assert run["naming"] == ("tiny_cpu-grpo-3", "tiny_cpu", ["grpo", "start_model"])
    logged = run["history"][1]
    assert logged["reward_mean"] == 0.5
    assert (logged["samples/rollouts/_type"], logged["samples/rollouts/nrows"], logged["samples/rollouts/ncols"]) == ("table-file", 1, 6)
    assert (logged["samples/validation/sums/_type"], logged["samples/validation/sums/nrows"]) == ("table-file", 2)
    assert json.loads((tmp_path / "run" / "samples.jsonl").read_text()) == rows[0]


def _verl_file(path: Path, prompts: list[Any], source: str, split: str) -> Path:
    """The recipe's layout: a system and a user message, the answer in reward_model, extra_info."""
    rows = [
        {
            "data_source": source,
            "prompt": [{"role": "system", "content": "Answer with the number."}, {"role": "user", "content": r.prompt}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": r.answer},
            "extra_info": {"index": i, "split": split},
        }
        for i, r in enumerate(prompts)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def _model_with_chat_template(model: Path, dest: Path) -> Path:
    """A copy of the tiny model whose chat template renders the user messages as the plain
    arithmetic prompt the model knows (the system message is not in its character vocabulary)."""
    import shutil

    shutil.copytree(model, dest)
    config_path = dest / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = "{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}{% endif %}{% endfor %}"
    config_path.write_text(json.dumps(config))
    return dest


def test_a_two_step_run_trains_from_verl_parquet_and_its_wandb_scalars_equal_metrics_jsonl(
        tiny_model_dir: Path, offline: Path, tmp_path: Path) -> None:  # fmt: skip
    prompts = arithmetic_prompts(216, seed=11)
    train = _verl_file(tmp_path / "train.parquet", prompts[:200], "arithmetic", "train")
    val = _verl_file(tmp_path / "sums-nosystem.parquet", prompts[200:], "arithmetic", "test")
    model = _model_with_chat_template(tiny_model_dir, tmp_path / "model")
    run = tmp_path / "run"
    cmd = [
        sys.executable, "-m", "megatron_pc", "train", "configs/tiny_cpu.yaml", f"run_dir={run}", f"model.path={model}",
        f"data.source={train}", f"data.validation=[{{path: {val}, name: sums}}]", "data.chat_template=true",
        "logging.wandb_project=mpc-ci", "training.steps=2", "training.validate_every=2", "training.val_samples=1",
        "allocation.train_batch=8", "allocation.pilot.batch=24", "training.mini_batch=8", "allocation.on_round_limit=train_partial",
        "logging.progress=false", "logging.tensorboard=false",
    ]  # fmt: skip
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    print(f"two-step verl + W&B run: {time.monotonic() - started:.1f} s")

    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[1]["generated"] > 0 and "val/sums/accuracy" in rows[0]
    runs = read_offline_runs(offline, 1)
    assert [r["id"] for r in runs] == [(run / WANDB_ID_FILE).read_text().strip()]
    assert runs[0]["config"]["data"]["source"] == str(train)
    history = runs[0]["history"]
    assert sorted(history) == [0, 1, 2]
    for r in rows:
        expected = {k: v for k, v in r.items() if k != "step" and isinstance(v, (int, float))}
        logged = {k: v for k, v in history[r["step"]].items() if not k.startswith("samples/")}  # the W&B tables of samples.jsonl
        differ = {k: (expected.get(k, "absent"), logged.get(k, "absent")) for k in expected.keys() | logged.keys() if expected.get(k) != logged.get(k)}
        assert differ == {}, f"step {r['step']}: (metrics.jsonl, W&B) {differ}"
