"""`megatron-pc bench rollouts --budget`, reduced: one regime, one seed, a budget of 768 rollouts
validated every 256, Pilot-Commit beside the field's allocators (SPEED-RL, GRESO, MoPPS) end to
end through `megatron-pc train`; then the equal-budget report and summary; then a second call that
finds every run finished by its rollouts."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_pc.allocation.check import check_trace
from megatron_pc.config import load_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
BUDGET, EVERY = 768, 256
SMALL = ["allocation.train_batch=8", "allocation.pilot.batch=24", "allocation.dapo_batch=8", "training.val_samples=2", "logging.progress=false"]
FLAGS = ["--shape", "small", "--regimes", "paper_like", "--seeds", "1", "--budget", str(BUDGET), "--validate-every-rollouts", str(EVERY),
         "--val-size", "48", "--train-size", "400", "--ablations", "none", "--variants", "none", "--calibration-prompts", "24",
         "--strategies", "pilot_commit,speed_rl,greso,mopps"]  # fmt: skip
LABELS = ["pilot_commit", "greso", "mopps", "speed_rl"]
"""The report's order: Pilot-Commit, then the others by name."""


def _bench(out: Path, model: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "megatron_pc", "bench", "rollouts", "configs/tiny_cpu.yaml", *SMALL, f"model.path={model}", *FLAGS, "--out", str(out)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1700)


@pytest.mark.timeout(1800)  # 4 trainings of a few steps and a second call; minutes on a quiet machine
def test_reduced_budget_benchmark_spends_equal_rollouts_validates_on_schedule_and_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = _bench(out, tiny_model_dir)
    assert proc.returncode == 0, proc.stderr[-6000:]
    progress = [line for line in proc.stderr.splitlines() if line.startswith("bench rollouts [")]
    assert len(progress) == 4 and all(f"/{BUDGET:,} rollouts" in p and "(trained)" in p for p in progress)

    regime_dir = out / "paper_like"
    for label in LABELS:
        run = regime_dir / f"{label}@reference" / "seed_0"
        rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
        steps = [r for r in rows if r["step"] > 0]
        # Stopped at the step that spent the budget.
        assert steps[-1]["cum_generated"] >= BUDGET > steps[-1]["cum_generated"] - steps[-1]["generated"], label
        crossing = {r["step"] for r in steps if r["cum_generated"] // EVERY > (r["cum_generated"] - r["generated"]) // EVERY}
        assert [r["step"] for r in rows if "val_accuracy" in r] == sorted({0, *crossing, steps[-1]["step"]}), label
        cfg = load_config(str(run / "config.yaml"))
        assert cfg.allocation.strategy == label and cfg.training.rollout_budget == BUDGET
        events = [json.loads(line) for line in (run / "trace.jsonl").read_text().splitlines()]
        assert check_trace(events, cfg.allocation) == [], label
    mopps_events = [json.loads(line) for line in (regime_dir / "mopps@reference" / "seed_0" / "trace.jsonl").read_text().splitlines()]
    assert any(e["event"] == "select" for e in mopps_events)

    summary = json.loads((out / "summary.json").read_text())
    assert summary["budget"] == BUDGET and summary["validate_every_rollouts"] == EVERY and summary["shape"]["name"] == "small"
    assert "paired per-seed ratios" in summary["statistic"] and "median over strategies" in summary["target_rule"]
    regime = summary["regimes"]["paper_like"]
    assert list(regime["strategies"]) == LABELS
    assert [row["share"] for row in regime["at_budget"]["speed_rl"]] == [0.25, 0.5, 0.75, 1.0]
    assert all(row["median"] is not None for label in LABELS for row in regime["at_budget"][label])
    assert set(regime["validation_precision"]) >= {"stderr", "smallest_gap", "ok"}
    for target in regime["targets"]:
        assert {"ci_low", "ci_high", "verdict"} <= set(target["strategies"]["greso"]["vs_pilot_commit"]["rollouts"])
    report = (out / "report.md").read_text()
    assert f"Validation accuracy at fixed spends (budget R = {BUDGET:,} rollouts" in report
    assert "budget_benchmark" in summary["estimate_seconds"]

    again = _bench(out, tiny_model_dir)
    assert again.returncode == 0, again.stderr[-6000:]
    assert sum("already finished" in line for line in again.stderr.splitlines()) == 4 and "training into" not in again.stderr
