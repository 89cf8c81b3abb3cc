"""Pipelined mode (training.pipelined) and binding off (allocation.binding=false), through the
real training loop with in-process stand-ins for the ranks and engines (as test_trainer_loop)."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path

import pytest

from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.trace import read_trace
from megatron_pc.driver.faults import ENV
from megatron_pc.driver.trainer import Trainer
from megatron_pc.errors import ConfigError
from megatron_pc.metrics.logger import read_metrics
from standins import StandInWorkers
from test_trainer_loop import _cfg, _data, _keys, kept_signal_handlers

PIPELINED = ("cluster.placement=split", "training.pipelined=true", "training.tis_cap=2.0")


def _run(cfg, tmp_path: Path) -> tuple[list[dict], list[dict]]:
    made: list[StandInWorkers] = []
    Trainer(cfg, _data(tmp_path), lambda *a: made.append(StandInWorkers(*a)) or made[-1]).run()
    run = cfg.resolved_run_dir
    return read_metrics(run / "metrics.jsonl"), read_trace(run / "trace.jsonl")


@pytest.mark.parametrize("strategy", ["pilot_commit", "grpo", "dapo"])
def test_pipelined_rollouts_are_one_step_off_policy_and_every_invariant_holds(tmp_path: Path, strategy: str) -> None:
    cfg = _cfg(tmp_path, strategy, *PIPELINED)
    rows, trace = _run(cfg, tmp_path)
    steps = rows[1:]
    assert [r["step"] for r in steps] == [1, 2, 3, 4]
    # Step 1 is generated on the start model; each later step during the update before it.
    assert [r["policy_lag"] for r in steps] == [0, 1, 1, 1]
    versions = {(e["step"], e["round"]): e["policy_version"] for e in trace if e["event"] == "generate"}
    assert {s: v for (s, _), v in versions.items()} == {1: 0, 2: 0, 3: 1, 4: 2}
    assert all(r["rollout_age_max"] >= 1 for r in steps[1:] if r.get("updates"))
    assert check_trace(trace, cfg.allocation) == []
    assert rows[-1]["cum_generated"] == sum(r["generated"] for r in steps)
    assert all(r["time_generate"] > 0 and "time_pipeline_wait" in r for r in steps[:-1])


def test_pilot_commit_pilots_are_older_by_their_buffer_wait() -> None:
    from megatron_pc.allocation import Rollout, StepResult, TrainGroup
    from megatron_pc.driver.pipeline import Versions

    versions = Versions(engines=3, by_step={2: 1, 3: 2, 4: 2})
    group = TrainGroup(7, [Rollout(1.0, True)] * 2 + [Rollout(0.0, False)] * 3, step=4, pilot_step=2, n_pilot=2)
    # Trained at step 4 by the policy of step 3: kept pilots came from version 1, commits from 2.
    assert versions.ages(StepResult(4, [group])) == [2, 2, 1, 1, 1]


def test_pipelined_resume_from_a_mid_run_checkpoint_continues_exactly(tmp_path: Path) -> None:
    import shutil

    straight = _cfg(tmp_path / "straight", "pilot_commit", *PIPELINED)
    rows, trace = _run(straight, tmp_path)
    # The same run resumed from its step-2 checkpoint, which holds step 3 already generated.
    again = _cfg(tmp_path / "again", "pilot_commit", *PIPELINED)
    shutil.copytree(straight.resolved_run_dir, again.resolved_run_dir)
    shutil.rmtree(again.resolved_run_dir / "checkpoints" / "step_00000004")
    resumed_rows, resumed_trace = _run(again, tmp_path)
    keys = ("generated", "cum_generated", "reward_mean", "loss", "val_accuracy", "policy_lag", "rollout_age_mean")
    assert [[r.get(k) for k in keys] for r in resumed_rows] == [[r.get(k) for k in keys] for r in rows]
    assert resumed_trace == trace


def test_extending_a_finished_pipelined_run_generates_its_first_new_step_on_policy(tmp_path: Path) -> None:
    # The last step prefetches nothing (its rollouts would never be trained or counted), so the
    # first step past it is generated after the last push.
    _run(_cfg(tmp_path / "ext", "pilot_commit", *PIPELINED, "training.steps=2"), tmp_path)
    rows, trace = _run(_cfg(tmp_path / "ext", "pilot_commit", *PIPELINED), tmp_path)
    assert [r["policy_lag"] for r in rows[1:]] == [0, 1, 0, 1]
    assert check_trace(trace, _cfg(tmp_path / "x", "pilot_commit", *PIPELINED).allocation) == []


def test_sigterm_during_a_pipelined_update_saves_the_prefetched_step_and_resumes_exactly(tmp_path: Path, monkeypatch) -> None:
    straight = _cfg(tmp_path / "straight", "pilot_commit", *PIPELINED)
    rows, trace = _run(straight, tmp_path)
    cfg = _cfg(tmp_path / "term", "pilot_commit", *PIPELINED, "training.save_every=3")
    with kept_signal_handlers():
        monkeypatch.setenv(ENV, "sigterm@update:2")
        trainer = Trainer(cfg, _data(tmp_path), partial(StandInWorkers))
        trainer.run()
        time.sleep(0.05)
        assert trainer.preempted and trainer.pending is not None and trainer.pending.result.step == 3
        assert [p.name for p in (cfg.resolved_run_dir / "checkpoints").iterdir()] == ["step_00000002"]
        monkeypatch.delenv(ENV)
        Trainer(cfg, _data(tmp_path), partial(StandInWorkers)).run()
    run = cfg.resolved_run_dir
    assert _keys(read_metrics(run / "metrics.jsonl")) == _keys(rows)
    assert read_trace(run / "trace.jsonl") == trace


def test_pipelined_mode_with_colocated_placement_is_refused_by_name(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"training.pipelined: needs cluster.placement=split"):
        _cfg(tmp_path, "pilot_commit", "training.pipelined=true")


def test_without_binding_a_round_of_pilots_and_commits_takes_two_engine_calls(tmp_path: Path) -> None:
    bound_rows, _ = _run(_cfg(tmp_path / "bound", "pilot_commit"), tmp_path)
    cfg = _cfg(tmp_path / "unbound", "pilot_commit", "allocation.binding=false")
    rows, trace = _run(cfg, tmp_path)
    assert check_trace(trace, cfg.allocation) == []
    rounds = {}
    for e in trace:
        if e["event"] in ("pilot", "commit"):
            rounds.setdefault((e["step"], e["round"]), set()).add(e["event"])
    for r in rows[1:]:
        mixed = sum(1 for (s, _), kinds in rounds.items() if s == r["step"] and kinds == {"pilot", "commit"})
        assert r["generate_calls"] == r["rounds"] + mixed
    assert sum(r["generate_calls"] for r in rows[1:]) > sum(r["generate_calls"] for r in bound_rows[1:])
    assert all(r["generate_calls"] == r["rounds"] for r in bound_rows[1:])


def test_the_trace_check_names_a_round_generated_too_far_off_policy() -> None:
    from megatron_pc.allocation.config import AllocationConfig

    events = [{"event": "generate", "step": 5, "round": 1, "rollouts": 8, "policy_version": 2}]
    assert check_trace(events, AllocationConfig()) == [
        "step 5: round 1 generated with policy version 2, 2 steps behind the policy it trains (at most 1: pipelined mode)"]
    assert check_trace([{**events[0], "policy_version": 3}], AllocationConfig()) == []


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_step_without_an_update_leaves_the_next_steps_on_policy(tmp_path: Path, pipelined: bool) -> None:
    # A keep band no pilot reaches and two rounds a step: every batch is empty (train_partial),
    # no update runs, and the engines' weights stay the policy's: every round has lag 0 (or 1 pipelined).
    cfg = _cfg(tmp_path, "pilot_commit", "allocation.p_lower=0.99", "allocation.p_upper=1.0", "allocation.max_rounds=2", *(PIPELINED if pipelined else ()))
    rows, trace = _run(cfg, tmp_path)
    assert not any(r.get("updates") for r in rows[1:])
    assert check_trace(trace, cfg.allocation) == []
    assert [r["policy_lag"] for r in rows[1:]] == ([0, 1, 1, 1] if pipelined else [0, 0, 0, 0])
