"""``megatron-pc bench train`` runs end to end on the tiny shape and prints usable figures."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from benchmarks.train import main, make_sequences

pytestmark = pytest.mark.integration


def _table_rows(out: str) -> dict[int, list[str]]:
    """Table rows keyed by TP: the lines after the dashed rule."""
    lines = out.splitlines()
    rule = next(i for i, line in enumerate(lines) if line and set(line) == {"-"})
    return {int(cols[0]): cols for cols in (line.split() for line in lines[rule + 1:] if line.strip())}


def test_sequences_have_tiny_task_lengths_and_both_advantage_signs() -> None:
    seqs = make_sequences(64, vocab_size=49, max_tokens=16, seed=0)
    assert all(6 <= s.prompt_len <= 10 and 8 <= s.response_len <= 16 for s in seqs)
    assert all(4 <= t < 49 for s in seqs for t in s.tokens)
    assert {s.advantage for s in seqs} == {1.0, -1.0}


def test_bench_train_prints_positive_tokens_per_second_and_memory_for_tp1_and_tp2(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A missing model path makes the bench build the random tiny model itself.
    rc = main(["--tp", "1,2", "--iters", "2", "--warmup", "1", "--batch", "24", f"model.path={tmp_path / 'absent'}"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "24 sequences" in out and "untrained" in out
    rows = _table_rows(out)
    assert sorted(rows) == [1, 2], out
    for tp, cols in rows.items():
        logprob_tps, train_tps = (float(c.replace(",", "")) for c in cols[1:3])
        assert math.isfinite(logprob_tps) and logprob_tps > 0, out
        assert math.isfinite(train_tps) and train_tps > 0, out
        rss = [float(m) for m in cols[5].split("/")]
        assert len(rss) == tp and all(100 < m < 16_000 for m in rss), out  # one figure per process
