"""scripts/verdict_table.py: the cross-regime verdict table of docs/benchmarks.md is what the script
prints from the kept equal-budget summaries, and bad summaries are refused by name."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_pc.errors import MegatronPCError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "verdict_table.py"
KEPT = ROOT / "results" / "bench_budget_report" / "summary.json"
MIXED = ROOT / "results" / "bench_budget" / "summary.json"


def _module():
    spec = importlib.util.spec_from_file_location("verdict_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_docs_cross_regime_table_is_the_scripts_output_on_the_kept_summaries() -> None:
    out = subprocess.run([sys.executable, str(SCRIPT), str(KEPT), str(MIXED)], capture_output=True, text=True, check=True).stdout
    assert "`mixed` GRPO/label" in out.splitlines()[0]
    rows = [line for line in out.splitlines() if line.startswith("| ") and not line.startswith("| label")]
    assert len(rows) == 13  # the matrix's ten labels and the metadata prior's three ablations on mixed
    docs = (ROOT / "docs" / "benchmarks.md").read_text()
    missing = [row for row in rows if row not in docs]
    assert not missing, f"docs/benchmarks.md lacks these rows of the kept summary's verdict table: {missing}"


def _summary(regime: str, per_seed: dict[str, dict[str, float]], ratio: float, verdict: str) -> dict:
    at_budget = {label: [{"share": 1.0, "median": sorted(v.values())[1], "min": min(v.values()), "max": max(v.values()), "per_seed": v}]
                 for label, v in per_seed.items()}  # fmt: skip
    target = {"accuracy": 0.3, "strategies": {"grpo": {"vs_pilot_commit": {"rollouts": {"ratio": ratio, "verdict": verdict}}}}}
    return {"budget": 100, "regimes": {regime: {"at_budget": at_budget, "targets": [target, target]}}}


def test_ratios_are_starred_only_where_the_interval_excludes_one_and_paired_differences_go_seed_by_seed(tmp_path: Path) -> None:
    vt = _module()
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_summary("hard", {"grpo": {"0": 0.1, "1": 0.2, "2": 0.3}, "pilot_commit": {"0": 0.2, "1": 0.1, "2": 0.35}}, 1.6, "other_more")))
    b.write_text(json.dumps(_summary("mixed", {"grpo": {"0": 0.5, "1": 0.5, "2": 0.5}, "pilot_commit": {"0": 0.4, "1": 0.6, "2": 0.5}}, 0.9, "tie")))
    regimes = vt.load_regimes([a, b])
    text = vt.table(regimes)
    assert "| pilot_commit | 0.200 [0.100-0.350] | 0.500 [0.400-0.600] | 1.60x* / 1.60x* | 0.90x / 0.90x |" in text
    assert "| grpo | 0.200 [0.100-0.300] | 0.500 [0.500-0.500] | - | - |" in text
    assert "| pilot_commit | +0.100, -0.100, +0.050 | -0.100, +0.100, +0.000 |" in vt.paired_table(regimes)


def test_bad_summaries_are_refused_naming_the_file(tmp_path: Path) -> None:
    vt = _module()
    bad = tmp_path / "steps.json"
    bad.write_text(json.dumps({"regimes": {}}))
    with pytest.raises(MegatronPCError, match="steps.json: no 'budget'"):
        vt.load_regimes([bad])
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(MegatronPCError, match="broken.json: not a readable summary.json"):
        vt.load_regimes([broken])
    with pytest.raises(MegatronPCError, match="regime paper_like is in an earlier summary too"):
        vt.load_regimes([KEPT, KEPT])
    run = subprocess.run([sys.executable, str(SCRIPT), str(KEPT), "--reference", "nobody"], capture_output=True, text=True)
    assert run.returncode == 1 and "--reference nobody: no such label" in run.stderr
