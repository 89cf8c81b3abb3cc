"""scripts/against_kept.py: new runs measured against a kept equal-budget summary (the kept
targets, paired per seed), and refused when they did not start where the kept runs did."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import yaml

from megatron_pc.analysis.regimes import REGIMES

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "against_kept.py"


def _run(root: Path, label: str, seed: int, points: list[tuple[int, float]]) -> Path:
    """A run in the benchmark's layout on `hard`, validated at these (rollouts, accuracy) points."""
    run = root / "hard" / f"{label}@reference" / f"seed_{seed}"
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "data": {"source": REGIMES["hard"].source}, "allocation": {"strategy": "pilot_commit"}}))
    rows = [{"step": i, "cum_generated": x, "val_accuracy": a} for i, (x, a) in enumerate(points)]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def _kept(start: float) -> dict:
    """A kept summary of `hard` (budget 400): GRPO reached the two targets at these rollouts per seed."""
    grpo = {"0": 0.20, "1": 0.30}
    at_budget = {"grpo": [{"share": s, "per_seed": {k: start + s * (v - start) for k, v in grpo.items()}} for s in (0.5, 1.0)]}
    targets = [{"accuracy": 0.12, "strategies": {"grpo": {"rollouts": {"per_seed": {"0": 200.0, "1": 100.0}}}}},
               {"accuracy": 0.15, "strategies": {"grpo": {"rollouts": {"per_seed": {"0": 300.0, "1": None}}}}}]  # fmt: skip
    return {"budget": 400, "regimes": {"hard": {"start_accuracy": start, "seeds": [0, 1], "fractions": [0.25, 0.5], "targets": targets,
                                                "at_budget": at_budget}}}  # fmt: skip


def test_new_runs_are_paired_with_the_kept_seeds_at_the_kept_targets(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(_kept(0.1)))
    runs = [_run(tmp_path, "pc_meta_coarse", 0, [(0, 0.1), (100, 0.12), (200, 0.16), (400, 0.25)]),
            _run(tmp_path, "pc_meta_coarse", 1, [(0, 0.1), (100, 0.12), (200, 0.14), (400, 0.145)])]  # fmt: skip
    out = subprocess.run([sys.executable, str(SCRIPT), str(summary), *map(str, runs), "--against", "grpo"],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    # Accuracy at R/2 (200): 0.16 and 0.14; at R: 0.25 and 0.145, minus GRPO's 0.20 and 0.30 seed by seed.
    assert "| pc_meta_coarse | 0.150 [0.140-0.160] | 0.198 [0.145-0.250] | +0.050, -0.155 |" in out
    # Target 0.12: seed 0 at 100 (GRPO 200: 2x), seed 1 at 100 (GRPO 100: 1x);
    # the median 1.5 with an interval holding 1: a tie, no star.
    assert "| pc_meta_coarse | 25% (0.1200) | 100 [100-100], 2/2 | 1.50x [1.00-2.00] |" in out
    # Target 0.15: seed 0 at 175 (GRPO 300), seed 1 never and GRPO's seed 1 never either: that seed is left out.
    assert "| pc_meta_coarse | 50% (0.1500) | 175 [175-175], 1/2 | 1.71x* [1.71-1.71] |" in out


def test_runs_from_another_start_or_with_other_seeds_are_refused_by_name(tmp_path: Path) -> None:
    summary = tmp_path / "summary.json"
    summary.write_text(json.dumps(_kept(0.1)))
    # Seeds sample differently at step 0: 0.09 and 0.11 average to the kept 0.10, so this label is taken.
    fine = [_run(tmp_path, "pc_meta_noisy", 0, [(0, 0.09), (400, 0.2)]), _run(tmp_path, "pc_meta_noisy", 1, [(0, 0.11), (400, 0.2)])]
    assert subprocess.run([sys.executable, str(SCRIPT), str(summary), *map(str, fine), "--against", "grpo"], capture_output=True).returncode == 0
    off = [_run(tmp_path, "pc_meta_coarse", 0, [(0, 0.11), (400, 0.2)]), _run(tmp_path, "pc_meta_coarse", 1, [(0, 0.11), (400, 0.2)])]
    bad = subprocess.run([sys.executable, str(SCRIPT), str(summary), *map(str, off), "--against", "grpo"], capture_output=True, text=True)
    assert bad.returncode == 1
    assert "hard: pc_meta_coarse's runs did not start where the kept runs did (mean step-0 accuracy 0.110000, kept 0.100000" in bad.stderr
    assert "pc_meta_coarse@reference/seed_0 0.110000" in bad.stderr
    alone = subprocess.run([sys.executable, str(SCRIPT), str(summary), str(_run(tmp_path, "x", 1, [(0, 0.1), (400, 0.2)])), "--against", "grpo"],
                           capture_output=True, text=True)  # fmt: skip
    assert alone.returncode == 1 and "hard: x has seeds 1, the kept runs 0, 1" in alone.stderr
    other = subprocess.run([sys.executable, str(SCRIPT), str(summary), *map(str, fine), "--against", "dapo"], capture_output=True, text=True)
    assert other.returncode == 1 and "--against: dapo not among hard's kept labels (grpo)" in other.stderr


def test_the_script_imports_without_running() -> None:
    spec = importlib.util.spec_from_file_location("against_kept", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.START_TOLERANCE < 1e-6
