"""The simulator and the controller benchmark, run the way a user runs them."""

from __future__ import annotations

import json
import re
from collections import defaultdict

from megatron_pc.allocation import Rollout, TrainGroup
from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.trace import read_trace
from megatron_pc.analysis.simulate import SimConfig, SimulatedPolicy
from megatron_pc.cli import main
from megatron_pc.config import load_config


def test_simulate_json_reports_rollouts_to_target_for_all_three_strategies(capsys) -> None:
    assert main(["simulate", "--json", "--seeds", "2", "--pool-size", "3000", "--target-accuracy", "0.45"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out["summary"]) == {"pilot_commit", "grpo", "dapo"}
    for name, s in out["summary"].items():
        assert s["runs"] == 2 and s["reached"] == 2, name
        assert s["min_rollouts_to_target"] <= s["median_rollouts_to_target"] <= s["max_rollouts_to_target"]
    for run in out["runs"]:
        assert run["final_accuracy"] >= 0.45 > run["start_accuracy"]
        assert run["rollouts_generated"] == run["rollouts_to_target"]


def test_simulate_trace_satisfies_every_invariant(tmp_path, capsys) -> None:
    path = tmp_path / "trace.jsonl"
    assert main(["simulate", "--seeds", "1", "--pool-size", "600", "--max-steps", "30", "--trace", str(path)]) == 0
    assert "pilot_commit" in capsys.readouterr().out
    by_run = defaultdict(list)
    for e in read_trace(path):
        by_run[e["strategy"]].append(e)
    assert set(by_run) == {"pilot_commit", "grpo", "dapo"}
    for name, events in by_run.items():
        cfg = load_config(None, [f"allocation.strategy={name}"]).allocation
        assert check_trace(events, cfg) == [], name


def test_simulated_policy_learns_only_from_groups_with_mixed_outcomes() -> None:
    sim = SimConfig(pool_size=10, validation_size=50)
    policy = SimulatedPolicy(sim, seed=0)
    before = policy.validation_accuracy()
    uniform = [TrainGroup(i, [Rollout(1.0, True)] * 4, step=1) for i in range(4)]
    policy.train(uniform)
    assert policy.validation_accuracy() == before
    mixed = [TrainGroup(i, [Rollout(1.0, True), Rollout(0.0, False)] * 2, step=1) for i in range(4)]
    policy.train(mixed)
    assert policy.validation_accuracy() > before


def test_simulate_refuses_an_invalid_config_before_any_work(capsys) -> None:
    assert main(["simulate", "allocation.p_lower=0.9", "allocation.p_upper=0.1"]) == 2
    err = capsys.readouterr().err
    assert "allocation.p_lower" in err and "<= p_upper" in err


def test_bench_controller_prints_milliseconds_per_reference_round(capsys) -> None:
    assert main(["bench", "controller", "--rounds", "3", "--pool-size", "20000"]) == 0
    out = capsys.readouterr().out
    assert "pilot 12,288 + commit 12,288 + direct 0 rollouts" in out
    assert re.search(r"median \d+\.\d ms", out)


def test_bench_controller_times_history_aware_rounds(capsys) -> None:
    assert main(["bench", "controller", "--rounds", "3", "--pool-size", "20000", "--history"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("controller round (history-aware)") and re.search(r"median \d+\.\d ms", out)


def test_simulate_runs_history_aware_pilot_commit_and_its_trace_holds(tmp_path, capsys) -> None:
    path = tmp_path / "trace.jsonl"
    assert main(["simulate", "--json", "--seeds", "1", "--pool-size", "600", "--max-steps", "40", "--strategies", "pilot_commit,pc_history",
                 "--target-accuracy", "0.99", "--trace", str(path)]) == 0  # fmt: skip
    out = json.loads(capsys.readouterr().out)
    assert set(out["summary"]) == {"pilot_commit", "pc_history"}
    events = [e for e in read_trace(path) if e["strategy"] == "pc_history"]
    cfg = load_config(None, ["allocation.history.preset=history_aware"]).allocation
    assert check_trace(events, cfg) == []
    assert any(e["event"] in ("screen", "direct") for e in events)  # the options acted


def test_a_simulated_run_whose_pool_is_all_evicted_ends_there(capsys) -> None:
    # Easy prompts and p_evict = 0.5: Pilot-Commit evicts the whole small pool within a few steps.
    assert main(["simulate", "--json", "--seeds", "1", "--pool-size", "300", "--max-steps", "200", "--difficulty-mean", "-4",
                 "--difficulty-std", "0.5", "--strategies", "pilot_commit", "--target-accuracy", "0.999", "allocation.p_evict=0.5"]) == 0  # fmt: skip
    run = json.loads(capsys.readouterr().out)["runs"][0]
    assert run["stopped"] and "evicted" in run["stopped"]
    assert run["steps"] < 200 and not run["reached"]


def test_bench_sweep_writes_its_table_and_verdicts(tmp_path, capsys) -> None:
    assert main(["bench", "sweep", "--means", "1", "--stds", "1,3", "--pools", "800", "--seeds", "2", "--steps", "30", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "settings passed every target (2 seeds, 30 steps" in out
    data = json.loads((tmp_path / "sweep.json").read_text())
    assert [(s["difficulty_std"], s["pool"]) for s in data["settings"]] == [(1.0, 800), (3.0, 800)]
    for setting in data["settings"]:
        assert 0.0 <= setting["grpo_zero_variance_share"] <= 1.0
        assert len(setting["targets"]) == 3
        for t in setting["targets"]:
            assert set(t["medians"]) == {"pilot_commit", "grpo", "dapo", "pc_history"}
            mine, best = t["medians"]["pc_history"], t["best_rival"]
            # The verdict is the stated rule, recomputed here.
            assert t["passed"] == (mine is not None and (best is None or mine <= t["ranges"][best][1]))
    assert (tmp_path / "sweep.md").read_text().count("\n| 1 |") == 6


def _rates() -> list[float]:
    """40% never solved, 20% always, 40% half the time (of 16 samples)."""
    return [0.0] * 40 + [1.0] * 20 + [0.5] * 40


def test_simulated_policy_starts_from_measured_success_rates() -> None:
    sim = SimConfig(pool_size=5000, validation_size=5000, success_rates=_rates(), success_samples=16)
    policy = SimulatedPolicy(sim, seed=0)
    p = [policy.p(i) for i in range(sim.pool_size)]
    # Posterior means: Beta(0.5, 16.5) 0.03, Beta(16.5, 0.5) 0.97, Beta(8.5, 8.5) 0.5.
    expected = 0.4 * 0.5 / 17 + 0.2 * 16.5 / 17 + 0.4 * 0.5
    assert abs(sum(p) / len(p) - expected) < 0.02
    assert abs(policy.validation_accuracy() - expected) < 0.02
    assert abs(sum(x < 0.15 for x in p) / len(p) - 0.4) < 0.03
    assert abs(sum(x > 0.85 for x in p) / len(p) - 0.2) < 0.03


def test_simulate_takes_a_file_of_measured_success_rates(tmp_path, capsys) -> None:
    path = tmp_path / "rates.json"
    path.write_text(json.dumps({"rates": _rates(), "samples": 16}))
    assert main(["simulate", "--json", "--seeds", "1", "--pool-size", "2000", "--max-steps", "20", "--success-rates", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["sim"]["success_rates"] == _rates()
    assert all(abs(run["start_accuracy"] - 0.41) < 0.03 for run in out["runs"])


def test_simulate_refuses_a_bad_success_rates_file_by_name(tmp_path, capsys) -> None:
    path = tmp_path / "rates.json"
    path.write_text("[0.5, 1.5]")
    assert main(["simulate", "--success-rates", str(path)]) == 2
    err = capsys.readouterr().err
    assert "--success-rates" in err and "in [0, 1]" in err
