"""scripts/ablation_table.py: the metadata prior's ablation table reads its ratios, accuracies and
allocation figures from a summary, marks ties by the interval, and refuses a regime without the labels."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_pc.errors import MegatronPCError

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "ablation_table.py"


def _module():
    spec = importlib.util.spec_from_file_location("ablation_table", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ratio(ratio: float, low: float, high: float) -> dict:
    return {"rollouts": {"ratio": ratio, "ci_low": low, "ci_high": high, "ci_high_unbounded": False, "status": "both",
                         "verdict": "tie" if low <= 1 <= high else ("other_more" if low > 1 else "other_less")}}  # fmt: skip


def _summary() -> dict:
    figures = {"pilot_share": 0.25, "trained_share": 0.8, "pilot_keep_rate": 0.2, "bucket_coverage": 0.94,
               "screen_brier": 0.159, "screen_brier_population": 0.165, "screen_auc": 0.58}  # fmt: skip
    strategies = {"grpo": {}, "pc_screen": dict(figures, bucket_coverage=None), "pc_meta_sized": figures}
    target = {"strategies": {"grpo": {"vs_pc_meta_sized": _ratio(1.86, 1.5, 2.37), "vs_pc_screen": _ratio(0.65, 0.6, 0.9)},
                             "pc_screen": {"vs_pc_meta_sized": _ratio(1.2, 0.9, 1.4)}}}  # fmt: skip
    at_budget = {"pc_meta_sized": [{"share": 1.0, "median": 0.112, "min": 0.106, "max": 0.118, "per_seed": {}}]}
    return {"budget": 40960, "regimes": {"hard": {"fractions": [0.25, 0.5], "targets": [target, target],
                                                  "strategies": strategies, "at_budget": at_budget}}}  # fmt: skip


def test_rows_carry_both_comparisons_the_accuracy_and_the_allocation(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(_summary()))
    out = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True, check=True).stdout
    assert out.startswith("`hard`:")
    assert ("| pc_meta_sized | 1.86x [1.50-2.37] | 1.86x [1.50-2.37] | 1.20x [0.90-1.40] tie | 1.20x [0.90-1.40] tie "
            "| 0.112 [0.106-0.118] | 0.25 | 0.80 | 0.20 | 0.94 | 0.159 (0.165) | 0.580 |") in out
    assert "| pc_screen | 0.65x [0.60-0.90] | 0.65x [0.60-0.90] | - | - | - | 0.25 | 0.80 | 0.20 | - |" in out
    assert "pc_meta_coarse" not in out  # labels the summary lacks are left out, not shown empty


def test_a_regime_without_any_of_the_labels_is_refused_by_name(tmp_path: Path) -> None:
    summary = _summary()
    summary["regimes"]["hard"]["strategies"] = {"grpo": {}}
    with pytest.raises(MegatronPCError, match="regime hard: none of pc_screen"):
        _module().table("hard", summary["regimes"]["hard"])
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    run = subprocess.run([sys.executable, str(SCRIPT), str(path)], capture_output=True, text=True)
    assert run.returncode == 1 and "ablation_table: regime hard: none of" in run.stderr


def test_the_docs_ablation_tables_are_the_scripts_output_on_the_kept_summaries() -> None:
    docs = (ROOT / "docs" / "metadata_prior.md").read_text()
    for kept, labels in (("bench_budget", 6), ("bench_ablate", 5), ("bench_ablate_pl", 6), ("bench_ablate_small", 6)):
        summary = ROOT / "results" / kept / "summary.json"
        out = subprocess.run([sys.executable, str(SCRIPT), str(summary)], capture_output=True, text=True, check=True).stdout
        rows = [line for line in out.splitlines() if line.startswith("| pc_")]
        assert len(rows) == labels, (kept, out)
        missing = [row for row in rows if row not in docs]
        assert not missing, f"docs/metadata_prior.md lacks these rows of {kept}'s ablation table: {missing}"
