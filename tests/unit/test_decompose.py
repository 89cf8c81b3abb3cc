"""megatron-pc decompose: the ratios of the update rules and controls side by side, per regime and
target, from a benchmark's layout; 1-update runs from another start model are left out."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from megatron_pc.analysis.decompose import decompose, find_runs, main, same_start
from megatron_pc.errors import MegatronPCError

ACCURACIES = [0.30, 0.34, 0.38, 0.42]


def _write(bench: Path, regime: str, label: str, seed: int, per_step: int, strategy: str, sha: str = "a" * 64) -> None:
    """A finished run of ``per_step`` rollouts a step, validated every 5 steps with ACCURACIES."""
    run = bench / regime / label / f"seed_{seed}"
    run.mkdir(parents=True)
    rows = [{"step": 0, "val_accuracy": ACCURACIES[0]}]
    for step in range(1, 5 * (len(ACCURACIES) - 1) + 1):
        row = {"step": step, "generated": per_step, "cum_generated": per_step * step, "time_total": 1.0}
        if step % 5 == 0:
            row["val_accuracy"] = ACCURACIES[step // 5]
        rows.append(row)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = {"seed": seed, "allocation": {"strategy": strategy, "train_batch": 32}, "training": {"mini_batch_unit": "call_rollouts", "mini_batch": 8},
           "data": {"source": "builtin:arithmetic_hard", "validation_size": 200}}  # fmt: skip
    (run / "config.yaml").write_text(yaml.safe_dump(cfg))
    run.with_suffix(".wall.json").write_text(json.dumps({"wall_seconds": 1.0}))
    (bench / regime / "start_model.json").write_text(json.dumps({"path": "m", "sha256": sha}))


def _bench(root: Path) -> Path:
    # Every label learns the same per step; only its rollouts per step differ, so each ratio is
    # the ratio of rollouts per step, at every target.
    for seed in (0, 1):
        for label, strategy, per_step in (("pilot_commit", "pilot_commit", 100), ("grpo", "grpo", 150), ("pc_4up", "pilot_commit", 50),
                                          ("grpo_fair", "grpo", 120), ("dapo", "dapo", 200), ("dapo_3x", "dapo", 300)):  # fmt: skip
            _write(root, "hard", f"{label}@reference", seed, per_step, strategy)
    return root


def test_each_column_is_its_ratio_of_rollouts_at_every_target(tmp_path: Path) -> None:
    reference = find_runs(_bench(tmp_path / "rules"))
    for seed in (0, 1, 2):
        _write(tmp_path / "equal", "hard", "pilot_commit", seed, 100, "pilot_commit")
        _write(tmp_path / "equal", "hard", "grpo", seed, 80, "grpo")
    table = decompose(reference, find_runs(tmp_path / "equal"))
    columns = table["regimes"]["hard"]["columns"]
    expected = {"equal1": 0.8, "reference": 1.5, "pc_4up": 3.0, "grpo_fair": 1.2, "dapo_1x": 2.0, "dapo_3x": 3.0}
    for key, value in expected.items():
        assert [c["ratio"] for c in columns[key]] == pytest.approx([value] * 3), key
        assert all(c["seed_min"] == pytest.approx(value) and c["seed_max"] == pytest.approx(value) for c in columns[key])
    assert table["regimes"]["hard"]["seeds"]["equal"] == {"grpo": [0, 1, 2], "pilot_commit": [0, 1, 2]}


def test_a_missing_control_is_a_dash_and_other_starts_are_left_out(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _bench(tmp_path / "rules")
    _write(tmp_path / "equal", "hard", "pilot_commit", 0, 100, "pilot_commit", sha="b" * 64)
    _write(tmp_path / "equal", "hard", "grpo", 0, 80, "grpo", sha="b" * 64)
    kept, left_out = same_start(find_runs(tmp_path / "equal"), tmp_path / "equal", tmp_path / "rules")
    assert kept == [] and left_out == ["hard"]
    assert main([str(tmp_path / "rules"), "--equal-runs", str(tmp_path / "equal"), "--out", str(tmp_path / "out")]) == 0
    text = (tmp_path / "out" / "decomposition.md").read_text()
    assert "| 25% | - | 1.50x [1.50-1.50] | 3.00x [3.00-3.00] |" in text
    assert f"1-update runs of hard ({tmp_path / 'equal'}) are left out" in text
    assert json.loads((tmp_path / "out" / "decomposition.json").read_text())["equal_left_out"] == [f"hard ({tmp_path / 'equal'})"]
    # A second 1-update benchmark from the same start fills the column.
    _write(tmp_path / "equal2", "hard", "pilot_commit", 0, 100, "pilot_commit")
    _write(tmp_path / "equal2", "hard", "grpo", 0, 80, "grpo")
    assert main([str(tmp_path / "rules"), "--equal-runs", str(tmp_path / "equal"), str(tmp_path / "equal2"), "--out", str(tmp_path / "o2")]) == 0
    assert "| 25% | 0.80x [0.80-0.80] | 1.50x" in (tmp_path / "o2" / "decomposition.md").read_text()


def test_unfinished_runs_are_not_counted_and_an_empty_directory_is_named(tmp_path: Path) -> None:
    _write(tmp_path / "b", "hard", "grpo@reference", 0, 100, "grpo")
    (tmp_path / "b" / "hard" / "grpo@reference" / "seed_0.wall.json").unlink()
    with pytest.raises(MegatronPCError, match="holds no finished runs"):
        find_runs(tmp_path / "b")
    with pytest.raises(MegatronPCError, match="does not exist"):
        find_runs(tmp_path / "nope")


def test_bench_rollouts_takes_several_equal_benchmarks_and_fills_the_column_from_the_same_start(tmp_path: Path) -> None:
    # `bench rollouts --equal-runs A --equal-runs B`: as `decompose --equal-runs A B`, each
    # directory's regimes kept only where they started from the bench's own start model.
    from megatron_pc.analysis.decompose import equal_runs_from
    from benchmarks.strategies import _parser

    args = _parser().parse_args(["--equal-runs", "one", "--equal-runs", "two", "--regimes", "hard"])
    assert args.equal_runs == ["one", "two"] and args.overrides == []
    _bench(tmp_path / "rules")
    _write(tmp_path / "equal", "hard", "grpo", 0, 80, "grpo", sha="b" * 64)
    _write(tmp_path / "equal2", "hard", "pilot_commit", 0, 100, "pilot_commit")
    _write(tmp_path / "equal2", "hard", "grpo", 0, 80, "grpo")
    runs, left_out = equal_runs_from([str(tmp_path / "equal"), str(tmp_path / "equal2")], tmp_path / "rules")
    assert sorted(r.strategy for r in runs) == ["grpo", "pilot_commit"] and {r.run_dir.parts[-4] for r in runs} == {"equal2"}
    assert left_out == [f"hard ({tmp_path / 'equal'})"]
