"""`megatron-pc bench faults`: the offline half (--quick) in CI, as a user runs it; the whole
suite behind the `long` marker (`python -m pytest -m long`), run by hand and reported. The
representative part of the training-run half runs in CI in test_train_e2e.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
KEYS = {"faults_injected", "faults_survived", "bad_inputs_tried", "bad_inputs_refused", "rollouts_lost", "checkpoints_lost"}


def test_quick_fault_suite_survives_every_fault_refuses_every_bad_input_and_loses_nothing(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "megatron_pc", "bench", "faults", "--quick", "--json", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert proc.stdout.strip(), f"bench faults printed no summary (exit {proc.returncode}):\n{proc.stderr[-3000:]}"
    summary = json.loads(proc.stdout)
    assert KEYS <= set(summary)
    assert proc.returncode == 0, summary["failed"]
    assert summary["faults_injected"] >= 9 and summary["faults_survived"] == summary["faults_injected"]
    assert summary["bad_inputs_tried"] >= 50 and summary["bad_inputs_refused"] == summary["bad_inputs_tried"]
    assert summary["rollouts_lost"] == 0 and summary["checkpoints_lost"] == 0
    assert summary["not_run"] == ["the training runs (--quick)"]
    # Every case is on record with its verdict.
    cases = json.loads((tmp_path / "faults.json").read_text())["cases"]
    assert len(cases) == summary["faults_injected"] + summary["bad_inputs_tried"] and all(c["ok"] for c in cases)


def test_a_fault_that_is_not_survived_is_reported_and_fails_the_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from benchmarks import faults

    # With checkpoint verification switched off, every damaged checkpoint would be resumed from:
    # the suite must count each case as not survived.
    monkeypatch.setattr("megatron_pc.driver.checkpoints.verify", lambda path, checksums=True: None)
    tally = faults.Tally()
    faults._damaged_checkpoints(tally, tmp_path)
    summary = tally.summary()
    assert summary["faults_survived"] == 0 and len(summary["failed"]) == summary["faults_injected"] == len(faults.DAMAGE)


@pytest.mark.long
@pytest.mark.timeout(3700)  # the suite runs about 25 minutes; its own limit is 3,600 s, over the 900 s default
def test_full_fault_suite_survives_every_fault_and_loses_nothing(tmp_path: Path) -> None:
    """The whole suite (about 25 minutes here): every fault injected into real tiny runs."""
    proc = subprocess.run([sys.executable, "-m", "megatron_pc", "bench", "faults", "--json", "--out", str(tmp_path)],
                          cwd=ROOT, capture_output=True, text=True, timeout=3600)  # fmt: skip
    summary = json.loads(proc.stdout)
    assert proc.returncode == 0, (summary["failed"], proc.stderr[-4000:])
    assert summary["faults_injected"] >= 25 and summary["faults_survived"] == summary["faults_injected"]
    assert summary["rollouts_lost"] == 0 and summary["checkpoints_lost"] == 0
    assert summary["max_sigterm_to_exit_s"] < summary["grace_period_s"]
