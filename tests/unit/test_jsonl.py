"""megatron_pc.jsonl: a kept (gzip) JSON-lines file reads as the plain one, compression is
byte-deterministic, the plain file wins when both exist, and the readers of runs (metrics,
trace, the report's run loader, the benchmark's finished-steps count) take either."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from megatron_pc.jsonl import compress, count_lines, decompress, find, read_jsonl

ROWS = [{"step": 0, "val_accuracy": 0.25}, {"step": 1, "cum_generated": 64, "val_accuracy": 0.5}]


def _write(path: Path, rows: list[dict] = ROWS) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")  # a blank last line is skipped
    return path


def test_a_compressed_file_reads_as_the_plain_one_by_either_name(tmp_path: Path) -> None:
    plain = _write(tmp_path / "metrics.jsonl")
    text = plain.read_bytes()
    packed = compress(plain)
    assert packed == tmp_path / "metrics.jsonl.gz" and not plain.exists()
    assert gzip.decompress(packed.read_bytes()) == text
    assert read_jsonl(plain) == read_jsonl(packed) == ROWS  # named plain, found compressed
    assert find(plain) == packed and count_lines(plain) == 2
    assert decompress(packed) == plain and plain.read_bytes() == text and not packed.exists()


def test_compression_is_byte_deterministic_whatever_the_name_and_time(tmp_path: Path) -> None:
    a, b = _write(tmp_path / "a" / "metrics.jsonl"), _write(tmp_path / "b" / "other.jsonl")
    os.utime(b, (time.time() - 86_400, time.time() - 86_400))
    first = compress(a).read_bytes()
    time.sleep(1.1)  # a header with the time in it would differ now
    assert compress(b).read_bytes() == first
    assert first[4:8] == b"\0\0\0\0" and not first[3] & 0x08  # mtime 0, no file name (RFC 1952)


def test_the_plain_file_wins_and_a_missing_file_names_both(tmp_path: Path) -> None:
    plain = _write(tmp_path / "metrics.jsonl")
    compress(plain)
    _write(plain, ROWS[:1])  # a restored run that went on writing
    assert find(plain) == plain and read_jsonl(plain) == ROWS[:1]
    assert find(tmp_path / "trace.jsonl") is None
    with pytest.raises(FileNotFoundError, match=r"trace\.jsonl: no such file \(nor trace\.jsonl\.gz beside it\)"):
        read_jsonl(tmp_path / "trace.jsonl")
    with pytest.raises(ValueError, match="already compressed"):
        compress(tmp_path / "metrics.jsonl.gz")


def test_metrics_trace_and_the_run_loader_read_a_kept_run(tmp_path: Path) -> None:
    from benchmarks.strategies import metrics_steps
    from megatron_pc.allocation.trace import read_trace
    from megatron_pc.analysis.runs import load_run, metrics_file, run_dirs
    from megatron_pc.metrics.logger import read_metrics

    run = tmp_path / "mixed" / "grpo" / "seed_0"
    compress(_write(run / "metrics.jsonl"))
    compress(_write(run / "trace.jsonl", [{"event": "plan", "step": 1}]))
    (run / "config.yaml").write_text("seed: 0\nallocation: {strategy: grpo}\ndata: {source: 'builtin:arithmetic_mixed'}\n")
    assert read_metrics(run / "metrics.jsonl") == ROWS and read_trace(run / "trace.jsonl") == [{"event": "plan", "step": 1}]
    assert metrics_file(run) == run / "metrics.jsonl.gz" and run_dirs(tmp_path, "*/*/seed_*") == [run]
    loaded = load_run(run)
    assert loaded.strategy == "grpo" and [p.accuracy for p in loaded.points] == [0.25, 0.5]
    assert metrics_steps(run) == 1


def test_the_command_line_compresses_and_decompresses(tmp_path: Path) -> None:
    plain = _write(tmp_path / "validation.jsonl")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    subprocess.run([sys.executable, "-m", "megatron_pc.jsonl", "compress", str(plain)], check=True, env=env, timeout=60)
    assert (tmp_path / "validation.jsonl.gz").is_file() and not plain.exists()
    subprocess.run([sys.executable, "-m", "megatron_pc.jsonl", "decompress", str(tmp_path / "validation.jsonl.gz")], check=True,
                   env=env, timeout=60)  # fmt: skip
    assert read_jsonl(plain) == ROWS
