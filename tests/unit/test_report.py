"""The rollouts report on synthetic metrics rows (no training): targets, reaching them, ratios,
spread over seeds, training seconds, the benchmark's regimes and sizes, and the clear errors."""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import sys
from collections import Counter
from pathlib import Path

import pytest
import yaml

from megatron_pc.analysis.regimes import REGIMES, parse_regimes
from megatron_pc.analysis.report import choose_targets, compare, first_reach, ratio, spread
from megatron_pc.analysis.runs import Point, Run, load_run, step_train_seconds
from benchmarks.calibration import matched_grpo_batch, predicted_keep_rate, sized_pilot_batch, zero_variance_share
from megatron_pc.cli import main
from megatron_pc.data.arithmetic import MIXES, Cell, Mix, mix_prompts
from megatron_pc.data.builtin import BUILTIN_SOURCES
from megatron_pc.errors import DataError, MegatronPCError


def _rows(accuracies: list[float], per_step: int = 100, every: int = 5, step_s: float = 1.0, val_s: float = 10.0) -> list[dict]:
    """Metrics rows of a run validated at step 0 and every ``every`` steps with these accuracies."""
    rows = [{"step": 0, "val_accuracy": accuracies[0]}]
    for step in range(1, every * (len(accuracies) - 1) + 1):
        row = {"step": step, "generated": per_step, "cum_generated": per_step * step, "time_generate": step_s * 0.6,
               "time_update": step_s * 0.3, "time_total": step_s, "zero_variance_share": 0.5, "group_reward_var_mean": 0.1}  # fmt: skip
        if step % every == 0:
            row["val_accuracy"] = accuracies[step // every]
            row["time_total"] += val_s
        rows.append(row)
    return rows


def _run(strategy: str, accuracies: list[float], seed: int = 0, per_step: int = 100, regime: str = "mixed") -> Run:
    return Run(regime, strategy, seed, Path(f"/runs/{strategy}/{seed}"), _rows(accuracies, per_step), val_prompts=1000, val_samples=4)


def test_reaching_a_target_interpolates_rollouts_between_validations() -> None:
    points = [Point(0, 0, 0, 0.40, None), Point(5, 500, 5, 0.44, None), Point(10, 1000, 10, 0.48, None)]
    assert first_reach(points, 0.46, "rollouts") == pytest.approx(750)
    assert first_reach(points, 0.44, "seconds") == 5
    assert first_reach(points, 0.40, "rollouts") == 0
    assert first_reach(points, 0.49, "rollouts") is None


def test_first_reach_counts_the_first_crossing_even_if_accuracy_falls_again() -> None:
    points = [Point(0, 0, 0, 0.40, None), Point(5, 500, 5, 0.50, None), Point(10, 1000, 10, 0.42, None)]
    assert first_reach(points, 0.45, "rollouts") == pytest.approx(250)


def test_targets_are_the_start_plus_fractions_of_the_smallest_final_gain() -> None:
    runs = [_run("pilot_commit", [0.40, 0.45, 0.50, 0.50, 0.50]), _run("grpo", [0.40, 0.42, 0.44, 0.44, 0.44]),
            _run("dapo", [0.40, 0.45, 0.48, 0.48, 0.48])]  # fmt: skip
    chosen = choose_targets(runs)
    assert chosen["start_accuracy"] == pytest.approx(0.40)
    assert chosen["final_gain"] == pytest.approx({"pilot_commit": 0.10, "grpo": 0.04, "dapo": 0.08})
    assert chosen["gain_used"] == pytest.approx(0.04)
    assert chosen["target_accuracies"] == pytest.approx([0.41, 0.42, 0.43])


def test_a_strategy_that_never_improves_does_not_set_the_targets_and_ablations_never_do() -> None:
    runs = [_run("pilot_commit", [0.40, 0.50, 0.50, 0.50]), _run("grpo", [0.40, 0.38, 0.39, 0.39]),
            _run("grpo_matched", [0.40, 0.41, 0.41, 0.41])]  # fmt: skip
    chosen = choose_targets(runs, fractions=(0.5,))
    assert chosen["strategies_without_gain"] == ["grpo"]
    assert chosen["target_accuracies"] == pytest.approx([0.45])
    flat = [_run("pilot_commit", [0.4, 0.4, 0.4]), _run("grpo", [0.4, 0.39, 0.39])]
    assert choose_targets(flat)["target_accuracies"] == []


def test_spread_over_seeds_counts_a_miss_as_infinitely_slow() -> None:
    s = spread({0: 300.0, 1: None, 2: 100.0})
    assert s == {"median": 300.0, "min": 100.0, "max": 300.0, "reached": 2, "runs": 3, "per_seed": {"0": 300.0, "1": None, "2": 100.0}}
    assert spread({0: None, 1: None, 2: 100.0})["median"] is None
    assert spread({0: 200.0, 1: 100.0})["median"] == 150.0


def test_ratio_is_other_over_pilot_commit_of_the_medians_with_the_per_seed_range() -> None:
    pc, grpo = spread({0: 100.0, 1: 200.0, 2: 300.0}), spread({0: 150.0, 1: 500.0, 2: 300.0})
    r = ratio(grpo, pc)
    assert r["ratio"] == pytest.approx(300 / 200) and r["status"] == "both"
    assert (r["seed_min"], r["seed_max"]) == pytest.approx((1.0, 2.5))
    assert ratio(spread({0: None}), spread({0: 100.0}))["status"] == "reference_only"
    assert ratio(spread({0: 100.0}), spread({0: None}))["status"] == "other_only"
    assert ratio(spread({0: None}), spread({0: None}))["ratio"] is None
    # Only the seeds both ran are paired: an ablation with one seed is compared on that seed.
    assert ratio(spread({1: 400.0}), pc)["seed_min"] == pytest.approx(2.0)


def test_compare_counts_rollouts_and_seconds_per_target_for_each_seed() -> None:
    # PC gains 0.02 per validation at 150 rollouts/step, GRPO 0.01 at 100: GRPO needs 2x the
    # validations, 1.33x the rollouts; seconds follow the steps (1 s each, validation excluded).
    runs = [_run("pilot_commit", [0.40, 0.42, 0.44, 0.46, 0.48], seed=s, per_step=150) for s in (0, 1)]
    runs += [_run("grpo", [0.40, 0.41, 0.42, 0.43, 0.44], seed=s) for s in (0, 1)]
    result = compare(runs, [0.44])
    assert result["seeds"] == [0, 1]
    target = result["targets"][0]["strategies"]
    assert target["pilot_commit"]["rollouts"]["median"] == pytest.approx(10 * 150)
    assert target["grpo"]["rollouts"]["median"] == pytest.approx(20 * 100)
    assert target["grpo"]["seconds"]["median"] == pytest.approx(20.0)
    assert target["grpo"]["vs_pilot_commit"]["rollouts"]["ratio"] == pytest.approx(2000 / 1500)
    assert target["grpo"]["vs_pilot_commit"]["seconds"]["ratio"] == pytest.approx(2.0)


def test_every_strategy_is_also_compared_with_each_pilot_commit_variant_present(tmp_path: Path) -> None:
    # pc_meta gains 0.02 a validation at 100 rollouts a step, GRPO 0.01: GRPO needs 2x pc_meta's rollouts.
    runs = [_run(name, accs, seed=s) for s in (0, 1) for name, accs in (
        ("pilot_commit", [0.40, 0.41, 0.42, 0.43, 0.44]), ("grpo", [0.40, 0.41, 0.42, 0.43, 0.44]),
        ("pc_meta", [0.40, 0.42, 0.44, 0.46, 0.48]), ("pc_screen", [0.40, 0.41, 0.42, 0.43, 0.44]))]  # fmt: skip
    target = compare(runs, [0.44])["targets"][0]["strategies"]
    assert target["grpo"]["vs_pc_meta"]["rollouts"]["ratio"] == pytest.approx(2.0)
    assert target["pc_screen"]["vs_pc_meta"]["rollouts"]["ratio"] == pytest.approx(2.0)
    assert target["pc_meta"]["vs_pc_screen"]["rollouts"]["ratio"] == pytest.approx(0.5)
    assert "vs_pc_meta" not in target["pc_meta"] and "vs_pc_history" not in target["grpo"]  # no pc_history runs here
    dirs = [str(_write_run(tmp_path / s / f"seed_{k}", s, k, [0.30, 0.32 + 0.01 * k, 0.36 if s == "pc_meta" else 0.33]))
            for s in ("pilot_commit", "grpo", "pc_meta") for k in (0, 1)]  # fmt: skip
    assert main(["report", *dirs, "--label-by", "dir", "--out", str(tmp_path / "rep")]) == 0
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "Rollouts against Pilot-Commit with metadata priors (pc_meta; above 1 it needed less):" in report
    assert "| target | pilot_commit/pc_meta | grpo/pc_meta |" in report
    assert "history-aware" not in report


def test_training_seconds_leave_out_the_validation() -> None:
    seconds = step_train_seconds(_rows([0.4, 0.5], step_s=2.0, val_s=30.0))
    assert seconds == pytest.approx({s: 2.0 for s in range(1, 6)})
    rows = _rows([0.4, 0.5])
    rows[5]["time_validation"] = 7.0
    assert step_train_seconds(rows)[5] == pytest.approx(1.0 + 10.0 - 7.0)


def test_validation_stderr_comes_from_the_rows_or_is_binomial() -> None:
    run = _run("grpo", [0.5, 0.6])
    assert run.points[0].stderr == pytest.approx(math.sqrt(0.25 / 4000))
    rows = _rows([0.5, 0.6])
    rows[0]["val_accuracy_stderr"] = 0.02
    assert Run("mixed", "grpo", 0, Path("x"), rows).points[0].stderr == 0.02


def test_a_run_without_validation_rows_is_refused_by_name(tmp_path: Path) -> None:
    rows = [r for r in _rows([0.4, 0.5]) if "val_accuracy" not in r]
    with pytest.raises(MegatronPCError, match=r"/runs/x: metrics.jsonl has no validation rows"):
        Run("mixed", "grpo", 0, Path("/runs/x"), rows)


def _write_run(path: Path, strategy: str, seed: int, accuracies: list[float], source: str = "builtin:arithmetic_hard") -> Path:
    path.mkdir(parents=True)
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(accuracies)))
    cfg = {"seed": seed, "allocation": {"strategy": strategy}, "data": {"source": source, "validation_size": 200},
           "training": {"val_samples": 2}}  # fmt: skip
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    return path


def test_load_run_takes_labels_from_the_run_config(tmp_path: Path) -> None:
    run = load_run(_write_run(tmp_path / "a" / "seed_3", "dapo", 3, [0.3, 0.4]))
    assert (run.regime, run.strategy, run.seed, run.val_prompts, run.val_samples) == ("hard", "dapo", 3, 200, 2)
    assert load_run(tmp_path / "a" / "seed_3", label_by="dir").strategy == "a"
    # The benchmark's layout names the rule in the directory; the label drops it (the rule comes
    # from the config), so Pilot-Commit is found as the reference and a control is a variant.
    pc = load_run(_write_run(tmp_path / "pilot_commit@reference" / "seed_0", "pilot_commit", 0, [0.3, 0.4]), label_by="dir")
    assert (pc.strategy, pc.variant) == ("pilot_commit", "none")
    fair = load_run(_write_run(tmp_path / "grpo_fair@reference" / "seed_0", "grpo", 0, [0.3, 0.4]), label_by="dir")
    assert (fair.strategy, fair.variant) == ("grpo_fair", "grpo_fair")
    # The field's allocators are strategies (their gains count toward the targets), as in the benchmark.
    speed = load_run(_write_run(tmp_path / "speed_rl@reference" / "seed_0", "speed_rl", 0, [0.3, 0.4]), label_by="dir")
    assert (speed.strategy, speed.variant) == ("speed_rl", "none")
    from benchmarks.strategies import FIELD_STRATEGIES as BENCH_FIELD
    from megatron_pc.allocation import STRATEGIES
    from megatron_pc.analysis.runs import FIELD_STRATEGIES

    assert FIELD_STRATEGIES == BENCH_FIELD and set(FIELD_STRATEGIES) < set(STRATEGIES)
    many = _write_run(tmp_path / "b" / "seed_0", "grpo", 0, [0.3, 0.4])
    cfg = yaml.safe_load((many / "config.yaml").read_text())
    cfg["data"]["validation"] = ["x.jsonl", "y.jsonl"]  # several sets carry their own stderr
    (many / "config.yaml").write_text(yaml.safe_dump(cfg))
    assert load_run(many).val_prompts is None


def test_report_command_writes_report_summary_and_three_plots(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    dirs = [str(_write_run(tmp_path / s / f"seed_{k}", s, k, [0.30, 0.32 + 0.01 * k, 0.36 if s == "pilot_commit" else 0.33]))
            for s in ("pilot_commit", "grpo") for k in (0, 1)]  # fmt: skip
    assert main(["report", *dirs, "--out", str(tmp_path / "rep")]) == 0
    summary = json.loads((tmp_path / "rep" / "summary.json").read_text())
    assert list(summary["regimes"]) == ["hard"]
    assert len(summary["regimes"]["hard"]["targets"]) == 3
    assert summary["plots"]["accuracy_vs_rollouts.png"] == ["hard: validation accuracy vs rollouts"]
    assert len(summary["plots"]["zero_variance.png"]) == 2 and len(summary["plots"]["ratios.png"]) == 2
    for name in summary["plots"]:
        assert (tmp_path / "rep" / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    report = (tmp_path / "rep" / "report.md").read_text()
    assert "## hard" in report and "grpo/PC" in report
    assert "report.md" in capsys.readouterr().out


def test_report_names_a_missing_run_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert f"run directory {tmp_path / 'nope'} does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "holds no metrics.jsonl" in capsys.readouterr().err


def test_report_refuses_two_runs_it_cannot_tell_apart(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = _write_run(tmp_path / "a" / "seed_0", "grpo", 0, [0.3, 0.4])
    b = _write_run(tmp_path / "b" / "seed_0", "grpo", 0, [0.3, 0.4])
    assert main(["report", str(a), str(b), "--out", str(tmp_path / "rep")]) == 2
    err = capsys.readouterr().err
    assert "are both grpo, seed 0, on hard" in err and "--label-by dir" in err


def test_unknown_regime_is_refused_before_any_run(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(MegatronPCError, match="--regimes: unknown regime 'easy'; known: mixed, paper_like, hard, default, multi_epoch"):
        parse_regimes("mixed,easy")
    assert main(["bench", "rollouts", "--regimes", "medium", "--out", "/nonexistent/x"]) == 2
    assert "unknown regime 'medium'" in capsys.readouterr().err


# ---- regimes and the ablations' sizes -----------------------------------------------------------


def test_every_regime_is_a_registered_builtin_source() -> None:
    assert list(REGIMES) == ["mixed", "paper_like", "hard", "default", "multi_epoch"]
    for regime in REGIMES.values():
        assert regime.source.removeprefix("builtin:") in BUILTIN_SOURCES
    # The multi-epoch regime is paper_like's content on a small pool of its own.
    assert REGIMES["multi_epoch"].source == REGIMES["paper_like"].source and REGIMES["multi_epoch"].train_size == 192


def test_a_mix_gives_each_cell_its_exact_share_of_distinct_correct_prompts() -> None:
    mix = Mix("t", "test", ((Cell("+", 1, 2), 1.0), (Cell("*", 2, 1), 2.0), (Cell("-", 3, 3), 1.0)))
    records = mix_prompts(mix, 401, seed=5)
    assert records == mix_prompts(mix, 401, seed=5) and records != mix_prompts(mix, 401, seed=6)
    assert len({r.id for r in records}) == 401
    shapes = Counter()
    for r in records:
        a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", r.prompt).groups()
        assert r.answer == str({"+": int(a) + int(b), "-": int(a) - int(b), "*": int(a) * int(b)}[op])
        shapes[(op, len(a), len(b))] += 1
    assert shapes == {("+", 1, 2): 100, ("*", 2, 1): 201, ("-", 3, 3): 100}


def test_a_cell_too_small_for_its_share_is_a_clear_error() -> None:
    mix = Mix("tiny", "test", ((Cell("+", 1, 1), 1.0), (Cell("+", 4, 4), 1.0)))
    with pytest.raises(DataError, match=r"builtin:tiny: cell d\+d holds 100 distinct prompts but its share of 400 prompts is 200"):
        mix_prompts(mix, 400, seed=0)


@pytest.mark.parametrize("name", sorted(MIXES))
def test_regime_mixes_hold_the_benchmark_pool(name: str) -> None:
    records = BUILTIN_SOURCES[name](21_000, 1)
    assert len({r.prompt for r in records}) == 21_000


def test_ablation_sizes_follow_the_measured_share_and_keep_rate() -> None:
    assert matched_grpo_batch(32, 0.0, 16, 1) == 32
    assert matched_grpo_batch(32, 0.6, 16, 1) == 80
    assert matched_grpo_batch(32, 0.999, 16, 1) == 256  # capped at 8 train batches
    assert matched_grpo_batch(32, 0.5, 3, 2) == 64  # rounded so 3 x batch divides over 2 engines
    assert sized_pilot_batch(32, 0.38, 4, 1) == 85
    assert sized_pilot_batch(32, 0.38, 4, 8) == 86


def test_predicted_keep_rate_and_zero_variance_share_from_measured_rates() -> None:
    assert zero_variance_share([0.0, 1.0, 0.5, 0.25]) == 0.5
    # 4 pilots, band [0.125, 0.75]: 1-3 successes keep the prompt.
    half = predicted_keep_rate([0.5], 16, 4, 0.125, 0.75)
    assert 0.8 < half < 1 - 2 * 0.5**4 + 0.01
    assert predicted_keep_rate([0.0], 16, 4, 0.125, 0.75) < 0.15
    assert predicted_keep_rate([1.0], 16, 4, 0.125, 0.75) < 0.25


def test_a_finished_run_with_another_configuration_is_not_reused(tmp_path: Path) -> None:
    from benchmarks.strategies import Job, check_same_config
    from megatron_pc.config import load_config, to_dict

    run_dir = tmp_path / "paper_like" / "grpo" / "seed_0"
    run_dir.mkdir(parents=True)
    job = Job(REGIMES["paper_like"], "grpo", "grpo", 0, ("training.lr=1e-4",), run_dir)
    saved = load_config(None, ["training.lr=1e-4", "allocation.strategy=grpo", "training.steps=150", f"run_dir={run_dir}"])
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(saved)))
    check_same_config("configs/tiny_cpu.yaml", job, ["training.lr=1e-4", "training.steps=20"])  # steps may differ
    with pytest.raises(MegatronPCError, match=r"holds a finished run with another configuration \(training.lr: 0.0001 -> 0.0002\)"):
        check_same_config("configs/tiny_cpu.yaml", job, ["training.lr=2e-4"])


def test_runs_of_one_seed_that_started_from_another_model_are_refused_by_name() -> None:
    from benchmarks.strategies import check_same_start

    runs = [_run(s, [0.30, 0.35, 0.40], seed) for s in ("pilot_commit", "grpo", "pc_history") for seed in (0, 1)]
    for run in runs:  # one start model: each seed validates alike at step 0, whatever the strategy
        run.rows[0]["val_greedy_accuracy"] = 0.31 + 0.01 * run.seed
    check_same_start(runs)
    odd = next(r for r in runs if r.strategy == "pc_history" and r.seed == 1)
    odd.rows[0]["val_greedy_accuracy"] = 0.33  # the same sampled accuracy, another greedy one: another model
    with pytest.raises(MegatronPCError, match=r"mixed seed 1: the runs did not start from the same model .*/runs/pc_history/1: "):
        check_same_start(runs)
    del odd.rows[0]["val_accuracy"]
    with pytest.raises(MegatronPCError, match=r"/runs/pc_history/1: metrics.jsonl has no step-0 validation"):
        check_same_start(runs)


def _model_dir(path: Path, weights: bytes) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text('{"model_type": "qwen2"}')
    (path / "model.safetensors").write_bytes(weights)
    return path


def test_a_regime_records_its_start_model_and_refuses_another(tmp_path: Path, capsys) -> None:
    from benchmarks.strategies import check_start_model, model_fingerprint
    from megatron_pc.config import load_config

    model = _model_dir(tmp_path / "model", b"weights made here")
    cfg = load_config(None, [f"model.path={model}"])
    regime_dir = tmp_path / "bench" / "paper_like"
    check_start_model(cfg, regime_dir)  # the first call records it
    record = json.loads((regime_dir / "start_model.json").read_text())
    assert record == {"path": str(model), "sha256": model_fingerprint(model)}
    check_start_model(cfg, regime_dir)  # the same model again: fine
    (model / "model.safetensors").write_bytes(b"weights made on another machine")
    with pytest.raises(MegatronPCError, match=r"paper_like: the model at .* is not the one the runs in .* started from"):
        check_start_model(cfg, regime_dir)
    # Runs kept from before records existed: no record is made up for them.
    old = tmp_path / "bench" / "mixed"
    (old / "grpo" / "seed_0").mkdir(parents=True)
    (old / "grpo" / "seed_0" / "metrics.jsonl").write_text("{}\n")
    check_start_model(cfg, old)
    assert not (old / "start_model.json").exists() and "checked by their step-0 validations only" in capsys.readouterr().err


def _kept_run(tmp_path: Path, steps: int) -> tuple[Path, object]:
    """A finished benchmark run kept without checkpoints: config.yaml and metrics.jsonl only."""
    from benchmarks.strategies import Job
    from megatron_pc.config import load_config, to_dict

    run_dir = tmp_path / "bench" / "paper_like" / "grpo" / "seed_0"
    run_dir.mkdir(parents=True)
    saved = load_config("configs/tiny_cpu.yaml", ["allocation.strategy=grpo", "seed=0", f"training.steps={steps}", f"run_dir={run_dir}"])
    (run_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(saved)))
    rows = [{"step": s, "cum_generated": 512 * s, "val_accuracy": 0.3 + 0.01 * s} for s in range(steps + 1)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir.parent / "seed_0.wall.json").write_text(json.dumps({"wall_seconds": 100.0, "from_step": 0}) + "\n")
    return run_dir, Job(REGIMES["paper_like"], "grpo", "grpo", 0, (), run_dir)


def test_a_finished_run_kept_without_checkpoints_is_reused_and_a_short_one_is_refused(tmp_path: Path, capsys) -> None:
    from benchmarks.strategies import Progress, finished_steps, run_job

    run_dir, job = _kept_run(tmp_path, 6)
    assert finished_steps(run_dir) == 6
    assert run_job("configs/tiny_cpu.yaml", job, 6, Progress(1)) is None  # finished: nothing trains
    assert "6/6 steps, 0 s (already finished)" in capsys.readouterr().err
    with pytest.raises(MegatronPCError, match=r"holds 6 steps of metrics but no checkpoints to continue from \(--steps 9\)"):
        run_job("configs/tiny_cpu.yaml", job, 9, Progress(1))


def test_bench_results_script_keeps_finished_runs_small_and_puts_them_back(tmp_path: Path) -> None:
    import subprocess

    run_dir, _ = _kept_run(tmp_path, 3)
    (run_dir / "checkpoints" / "step_3").mkdir(parents=True)
    (run_dir / "trace.jsonl").write_text("{}\n")
    (run_dir.parents[1] / "validation.jsonl").write_text('{"id": "v0"}\n')
    bench, results = tmp_path / "bench", tmp_path / "results"
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_results.sh"
    subprocess.run(["bash", str(script), "save", str(bench), str(results)], check=True, capture_output=True)
    kept = sorted(p.relative_to(results).as_posix() for p in results.rglob("*") if p.is_file())
    assert kept == ["paper_like/grpo/seed_0.wall.json", "paper_like/grpo/seed_0/config.yaml", "paper_like/grpo/seed_0/metrics.jsonl.gz",
                    "paper_like/validation.jsonl.gz"]  # fmt: skip
    packed = (results / "paper_like" / "grpo" / "seed_0" / "metrics.jsonl.gz").read_bytes()
    subprocess.run(["bash", str(script), "save", str(bench), str(results)], check=True, capture_output=True)  # saved again: same bytes
    assert (results / "paper_like" / "grpo" / "seed_0" / "metrics.jsonl.gz").read_bytes() == packed
    fresh = tmp_path / "fresh"
    subprocess.run(["bash", str(script), "restore", str(fresh), str(results)], check=True, capture_output=True)
    assert (fresh / "paper_like" / "grpo" / "seed_0" / "metrics.jsonl").read_text() == (run_dir / "metrics.jsonl").read_text()
    assert (fresh / "paper_like" / "validation.jsonl").read_text() == '{"id": "v0"}\n'
    assert not list(fresh.rglob("*.gz"))  # restored runs are plain run directories again
    proc = subprocess.run(["bash", str(script), "save", str(tmp_path / "nowhere"), str(results)], capture_output=True, text=True)
    assert proc.returncode == 2 and "does not exist" in proc.stderr
    # A validation set over the limit is kept as its SHA-256 only (the benchmark makes it again and checks it).
    env = {**os.environ, "KEEP_VALIDATION_MAX_BYTES": "5"}
    subprocess.run(["bash", str(script), "save", str(bench), str(results)], check=True, capture_output=True, env=env)
    assert not list(results.glob("paper_like/validation.jsonl*"))
    assert (results / "paper_like" / "validation.sha256").read_text().strip() == hashlib.sha256(b'{"id": "v0"}\n').hexdigest()


def test_a_validation_set_made_again_must_match_the_kept_record(tmp_path: Path) -> None:
    from benchmarks.strategies import write_validation_set

    path = tmp_path / "hard" / "validation.jsonl"
    write_validation_set(REGIMES["hard"], 20, path)
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    path.unlink()
    (tmp_path / "hard" / "validation.sha256").write_text(digest + "\n")
    write_validation_set(REGIMES["hard"], 20, path)  # the same set: taken
    assert hashlib.sha256(path.read_bytes()).hexdigest() == digest
    path.unlink()
    with pytest.raises(MegatronPCError, match="is not the one the kept runs were validated on"):
        write_validation_set(REGIMES["hard"], 21, path)
    assert not path.exists()


def test_bench_results_script_saves_plots_with_the_projects_python_not_the_systems(tmp_path: Path) -> None:
    """`save` shrinks the report's PNGs with Pillow, which the project's venv has and a fresh
    machine's system python3 lacks: without PYTHON set, the script uses the venv's interpreter."""
    import random
    import subprocess

    from PIL import Image

    _kept_run(tmp_path, 3)
    bench, results = tmp_path / "bench", tmp_path / "results"
    Image.frombytes("RGB", (64, 64), random.Random(0).randbytes(64 * 64 * 3)).save(bench / "ratios.png")  # noise: a palette is smaller
    # a python3 on PATH that cannot run anything: the script must not reach for it
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python3").write_text("#!/bin/sh\necho 'system python3 called' >&2\nexit 97\n")
    (stub / "python3").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "PYTHON"}
    env["PATH"] = f"{stub}:{env.get('PATH', '')}"
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_results.sh"
    proc = subprocess.run(["bash", str(script), "save", str(bench), str(results)], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "system python3 called" not in proc.stderr
    with Image.open(results / "ratios.png") as kept:
        assert kept.mode == "P"  # shrunk to a palette by megatron_pc.analysis.kept


def test_bench_results_script_keeps_the_start_model_and_puts_it_back_where_none_is(tmp_path: Path) -> None:
    import subprocess

    from benchmarks.strategies import model_fingerprint

    run_dir, _ = _kept_run(tmp_path, 3)
    model = _model_dir(tmp_path / "models" / "tiny", b"the start weights")
    sha = model_fingerprint(model)
    (run_dir.parents[1] / "start_model.json").write_text(json.dumps({"path": "models/tiny", "sha256": sha}))
    bench, results = tmp_path / "bench", tmp_path / "results"
    script = Path(__file__).resolve().parents[2] / "scripts" / "bench_results.sh"
    subprocess.run(["bash", str(script), "save", str(bench), str(results)], check=True, capture_output=True, cwd=tmp_path)
    assert (results / "start_models" / sha[:12] / "model.safetensors").read_bytes() == b"the start weights"
    assert (results / "paper_like" / "start_model.json").is_file()
    fresh = tmp_path / "fresh_machine"
    fresh.mkdir()
    proc = subprocess.run(["bash", str(script), "restore", str(fresh / "bench"), str(results)], check=True, capture_output=True,
                          text=True, cwd=fresh)  # fmt: skip
    assert f"start model {sha[:12]} put back at models/tiny" in proc.stdout
    assert model_fingerprint(fresh / "models" / "tiny") == sha
    assert not (fresh / "bench" / "start_models").exists()
    # A model already there is left alone (the benchmark refuses it if it is another one).
    (fresh / "models" / "tiny" / "model.safetensors").write_bytes(b"another model")
    subprocess.run(["bash", str(script), "restore", str(fresh / "bench"), str(results)], check=True, capture_output=True, cwd=fresh)
    assert (fresh / "models" / "tiny" / "model.safetensors").read_bytes() == b"another model"


def test_accuracy_at_budgets_interpolates_between_validations_and_marks_runs_that_stop_short(tmp_path: Path) -> None:
    import subprocess

    script = Path(__file__).resolve().parents[2] / "scripts" / "accuracy_at_budgets.py"
    for strategy, seed, points in (("grpo", 0, [(0, 0.2), (100, 0.3), (200, 0.4)]), ("grpo", 1, [(0, 0.2), (100, 0.5)]),
                                   ("pc_history", 0, [(0, 0.2), (50, 0.6)])):  # fmt: skip
        run = tmp_path / strategy / f"seed_{seed}"
        run.mkdir(parents=True)
        rows = [{"step": i, "cum_generated": x, "val_accuracy": a} for i, (x, a) in enumerate(points)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, str(script), str(tmp_path), "50,150"], capture_output=True, text=True, check=True).stdout
    lines = {line.split(" | ")[0].strip("| "): line for line in out.splitlines()}
    # grpo at 50: 0.25 and 0.35 (median 0.30); at 150 only seed 0 got that far (0.35).
    assert "| grpo | 2 | 0.300 [0.250-0.350] | 0.350 [0.350-0.350] (1/2) |" in lines["grpo"]
    assert "| pc_history | 1 | 0.600 [0.600-0.600] | - (0/1 got that far) |" in lines["pc_history"]
    bad = subprocess.run([sys.executable, str(script), str(tmp_path), "50,lots"], capture_output=True, text=True)
    assert bad.returncode == 1 and "budgets must be whole numbers" in bad.stderr


def test_every_label_of_the_benchmark_matrix_has_its_own_colour() -> None:
    from megatron_pc.analysis.report_plots import FIELD_ALLOCATORS, _color
    from megatron_pc.analysis.runs import MAIN_STRATEGIES, VARIANT_REFERENCES

    labels = [*MAIN_STRATEGIES, *FIELD_ALLOCATORS, *VARIANT_REFERENCES, "grpo_matched", "pc_sized"]
    colours = [_color(name, i) for i, name in enumerate(labels)]
    assert len(set(colours)) == len(labels), dict(zip(labels, colours))


def test_the_multi_epoch_pool_is_its_own_task_beside_the_full_paper_like_pool(tmp_path: Path) -> None:
    from megatron_pc.analysis.runs import check_unique

    runs = []
    for regime, train_size in (("paper_like", 20000), ("multi_epoch", 192)):
        run_dir = _write_run(tmp_path / regime / "grpo@reference" / "seed_0", "grpo", 0, [0.2, 0.3], source="builtin:arithmetic_paper_like")
        cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
        cfg["data"]["train_size"] = train_size
        (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg))
        runs.append(load_run(run_dir, label_by="dir"))
    assert [r.regime for r in runs] == ["paper_like", "multi_epoch"]
    check_unique(runs)  # one report may hold both


def test_a_run_stopped_before_its_first_checkpoint_is_trained_again_not_refused(tmp_path: Path, monkeypatch, capsys) -> None:
    """A benchmark interrupted during a run's first steps left metrics, no checkpoints and no
    wall.json: the same command starts that run again (nothing of it can be continued), while a
    kept finished run asked for more steps is still refused."""
    import benchmarks.strategies as strategies

    run_dir, job = _kept_run(tmp_path, 2)
    (run_dir.parent / "seed_0.wall.json").unlink()  # it never finished
    calls = []

    def fake_train(config, strategy, overrides, steps, out):  # the trainer itself is tested elsewhere
        calls.append((strategy, steps, out.exists()))
        return 12.0

    monkeypatch.setattr(strategies, "run_strategy", fake_train)
    record = strategies.run_job("configs/tiny_cpu.yaml", job, 9, strategies.Progress(1))
    assert calls == [("grpo", 9, False)]  # the partial directory was cleared before training
    assert record == {"wall_seconds": 12.0, "from_step": 0}
    assert "was stopped after 2 steps, before its first checkpoint" in capsys.readouterr().err
    # A finished run (its wall.json beside it) with too few steps is not thrown away.
    run_dir, job = _kept_run(tmp_path / "kept", 2)
    with pytest.raises(MegatronPCError, match="holds 2 steps of metrics but no checkpoints"):
        strategies.run_job("configs/tiny_cpu.yaml", job, 9, strategies.Progress(1))
    assert run_dir.is_dir() and calls == [("grpo", 9, False)]
