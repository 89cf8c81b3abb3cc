"""`megatron-pc bench rollouts`, reduced: one regime, one seed, 2 steps, the three strategies,
history-aware Pilot-Commit (pc_history) and the controls (grpo_fair, dapo_3x, grpo_half, pc_4up)
under the reference update rule, pc_4up under its own equal rule (4 updates), end to end through
`megatron-pc train`; then the report, the summary and the plots; then a second call that finds
every run finished."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_pc.allocation.check import check_trace
from benchmarks.strategies import model_fingerprint
from megatron_pc.config import load_config

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]

SMALL = [
    "allocation.train_batch=8",
    "allocation.pilot.batch=24",
    "allocation.dapo_batch=8",
    "training.mini_batch=8",
    "training.val_samples=2",
    "allocation.on_round_limit=train_partial",
    "logging.progress=false",
]
FLAGS = ["--regimes", "paper_like", "--seeds", "1", "--steps", "2", "--validate-every", "1", "--val-size", "48",
         "--train-size", "400", "--ablations", "none", "--calibration-prompts", "24", "--update-rule", "reference",
         "--variants", "pc_history,grpo_fair,dapo_3x,grpo_half,pc_4up"]  # fmt: skip
LABELS = ["pilot_commit", "grpo", "dapo", "dapo_3x", "grpo_fair", "grpo_half", "pc_4up", "pc_history"]
"""The report's order: the strategies, then the variants by name."""
RULES = {label: "equal/4" if label == "pc_4up" else "reference" for label in LABELS}
DIRS = {label: f"{label}@{RULES[label].replace('/', '')}" for label in LABELS}


def _bench(out: Path, model: Path) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "megatron_pc", "bench", "rollouts", "configs/tiny_cpu.yaml", *SMALL, f"model.path={model}", *FLAGS, "--out", str(out)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1500)


def _is_png(path: Path) -> tuple[int, int]:
    from PIL import Image

    with Image.open(path) as image:
        assert image.format == "PNG", path
        return image.size


@pytest.mark.long  # a benchmark, kept out of CI
@pytest.mark.timeout(1800)  # 8 trainings and a second call: 6 min on a quiet 2-core machine, 13 min loaded; over the 900 s default
def test_reduced_benchmark_writes_report_summary_and_plots_and_resumes(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "bench"
    proc = _bench(out, tiny_model_dir)
    assert proc.returncode == 0, proc.stderr[-6000:]
    progress = [line for line in proc.stderr.splitlines() if line.startswith("bench rollouts [")]
    assert len(progress) == 8 and all("paper_like" in p and "2/2 steps" in p and "(trained)" in p for p in progress)

    # The regime recorded the model its runs started from (checked again by the second call).
    record = json.loads((out / "paper_like" / "start_model.json").read_text())
    assert record["sha256"] == model_fingerprint(tiny_model_dir) and record["path"] == str(tiny_model_dir)
    summary = json.loads((out / "summary.json").read_text())
    regime = summary["regimes"]["paper_like"]
    assert list(regime["strategies"]) == LABELS
    assert {r["strategy"]: (r["update_rule"], r["variant"], Path(r["run_dir"]).parent.name) for r in regime["runs"]} == {
        label: (RULES[label], "none" if label in ("pilot_commit", "grpo", "dapo") else label, DIRS[label]) for label in LABELS}  # fmt: skip
    _check_rules_and_controls(out / "paper_like", regime["strategies"])
    # pc_history ran through the real trainer with the preset on: its trace carries the
    # posterior's predictions and holds every invariant of the history-aware options.
    history_dir = out / "paper_like" / DIRS["pc_history"] / "seed_0"
    events = [json.loads(line) for line in (history_dir / "trace.jsonl").read_text().splitlines()]
    assert all("p_keep" in e and "evict_prob" in e for e in events if e["event"] == "pilot") and any(e["event"] == "pilot" for e in events)
    cfg = load_config(str(history_dir / "config.yaml"))
    assert cfg.allocation.history.preset == "history_aware" and check_trace(events, cfg.allocation) == []
    for name, figures in regime["strategies"].items():
        rows = _rows(out / "paper_like", name)
        assert [r["step"] for r in rows] == [0, 1, 2]
        assert figures["steps"] == 2 and figures["rollouts"] == rows[-1]["cum_generated"]
        assert 0 <= figures["zero_variance_share"] <= 1 and figures["step_seconds"] > 0
        accuracy = rows[-1]["val_accuracy"]
        assert figures["val_stderr"] == pytest.approx((accuracy * (1 - accuracy) / (48 * 2)) ** 0.5)  # binomial
    assert regime["strategies"]["pilot_commit"]["pilot_keep_rate"] is not None
    assert regime["strategies"]["grpo"]["pilot_keep_rate"] is None
    report = (out / "report.md").read_text()
    # Three steps of the barely warmed-up test model may gain nothing: then there is no target.
    assert len(regime["targets"]) == len(regime["target_accuracies"]) == len(regime["fractions"])
    if regime["targets"]:
        shown = " | ".join(f"{n} [{RULES[n]}]" for n in LABELS)
        assert f"| target | {shown} | grpo/PC | dapo/PC |" in report
        for target in regime["targets"]:
            assert set(target["strategies"]) == set(LABELS)
            assert set(target["strategies"]["grpo"]["vs_pilot_commit"]) == {"rollouts", "seconds"}
            assert set(target["strategies"]["grpo"]["vs_pc_history"]) == {"rollouts", "seconds"}
        assert "| target | pilot_commit/pc_history | grpo/pc_history | dapo/pc_history | dapo_3x/pc_history |" in report
    else:
        assert "No strategy improved on the start accuracy: no targets." in report
    calibration = summary["calibration"]["paper_like"]
    assert calibration["prompts"] == 24 and 0 <= calibration["z"] <= 1
    assert set(summary["simulator"]["paper_like"]) >= {"ratios", "command", "lr", "learning", "held_out_error"}
    assert summary["simulator"]["paper_like"]["learning"] == "fitted" and "held-out error" in report
    # The decomposition table: every column for each target (a ratio, or None where a label
    # never reached it), in summary.json and the report.
    columns = summary["decomposition"]["regimes"]["paper_like"]["columns"]
    assert set(columns) == {"equal1", "reference", "pc_4up", "grpo_fair", "dapo_1x", "dapo_3x"}
    assert all(len(c) == len(summary["decomposition"]["fractions"]) for c in columns.values())
    assert "## Where the paper's gain comes from" in report

    assert "## paper_like" in report and "## The simulator beside the measurement" in report
    assert "| pilot_commit | reference | none | 1 |" in report and "| pc_4up | equal/4 | pc_4up | 1 |" in report
    panels = {"accuracy_vs_rollouts.png": 1, "zero_variance.png": 2, "ratios.png": 2}
    assert {name: len(titles) for name, titles in summary["plots"].items()} == panels
    for name in panels:
        width, height = _is_png(out / name)
        assert width >= 400 and height >= 300
        assert f"]({name})" in report

    again = _bench(out, tiny_model_dir)
    assert again.returncode == 0, again.stderr[-6000:]
    assert sum("already finished" in line for line in again.stderr.splitlines()) == 8
    assert "training into" not in again.stderr
    assert json.loads((out / "summary.json").read_text())["regimes"]["paper_like"]["strategies"] == regime["strategies"]


def _rows(regime_dir: Path, label: str) -> list[dict]:
    return [json.loads(line) for line in (regime_dir / DIRS[label] / "seed_0" / "metrics.jsonl").read_text().splitlines()]


def _check_rules_and_controls(regime_dir: Path, figures: dict[str, dict]) -> None:
    """Each run trained under its rule's settings, took at most the updates that rule gives
    (exactly, where the batch is always full), and ran its control's setting."""
    for label in LABELS:
        cfg = load_config(str(regime_dir / DIRS[label] / "seed_0" / "config.yaml"))
        # Reference: a quarter of the train batch of 8, in call rollouts; pc_4up: 8 / 4 groups.
        assert (cfg.training.mini_batch_unit, cfg.training.mini_batch) == (("groups", 2) if label == "pc_4up" else ("call_rollouts", 2))
    steps = {label: [r for r in _rows(regime_dir, label) if r["step"] > 0] for label in LABELS}
    trained = {label: [r["updates"] for r in steps[label] if "updates" in r] for label in LABELS}
    # GRPO 8 x 16 rows in mini-batches of 2 x 16: 4 updates; PC 8 groups x (4 + 12) rows in 2 x 12:
    # 6; pc_4up 4 of 2 groups; grpo_half half the rows in the same mini-batches: 2. PC and DAPO
    # may train fewer groups (a partial step; the barely warmed test model keeps few prompts).
    most = {"pilot_commit": 6, "pc_history": 6, "grpo": 4, "grpo_fair": 4, "dapo": 4, "dapo_3x": 4, "pc_4up": 4, "grpo_half": 2}
    assert all(u <= most[label] for label in LABELS for u in trained[label])
    assert {label: trained[label] for label in ("grpo", "grpo_fair", "grpo_half")} == {"grpo": [4, 4], "grpo_fair": [4, 4], "grpo_half": [2, 2]}
    for label in LABELS:
        assert figures[label]["updates_per_step"] == (sum(trained[label]) / len(trained[label]) if trained[label] else None)
    assert all(r["generated"] == 4 * 16 for r in steps["grpo_half"]) and all(r["generated"] == 8 * 16 for r in steps["grpo"])
    # dapo_3x draws 3 x 8 prompts a round: at least 24 x 16 rollouts a step.
    assert all(r["generated"] >= 24 * 16 for r in steps["dapo_3x"])
    fair = load_config(str(regime_dir / DIRS["grpo_fair"] / "seed_0" / "config.yaml"))
    plain = load_config(str(regime_dir / DIRS["grpo"] / "seed_0" / "config.yaml"))
    assert (fair.training.loss_denominator, plain.training.loss_denominator) == ("informative", "all")


def test_unknown_regime_and_bad_sizes_are_refused_before_any_run(tmp_path: Path) -> None:
    base = [sys.executable, "-m", "megatron_pc", "bench", "rollouts", "--out", str(tmp_path / "b")]
    proc = subprocess.run([*base, "--regimes", "mixed,trivial"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--regimes: unknown regime 'trivial'; known: mixed, paper_like, hard, default" in proc.stderr
    proc = subprocess.run([*base, "--variants", "pc_magic"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--variants: unknown ['pc_magic']; choose from pc_history, pc_screen, pc_screen_policy, pc_meta, pc_meta_coarse, pc_meta_noisy, pc_meta_sized, pc_screen_sized, pc_meta_sized_sp2, pc_screen_sized_sp2, grpo_fair, dapo_3x, grpo_half, pc_4up, or none" in proc.stderr
    proc = subprocess.run([*base, "--seeds", "0"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--seeds: must be >= 1, got 0" in proc.stderr
    assert not (tmp_path / "b").exists()
