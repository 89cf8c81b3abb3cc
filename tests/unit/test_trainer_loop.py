"""The training loop itself (megatron_pc.driver.trainer.Trainer) with in-process stand-ins for
the policy ranks and the engines: no Ray, no Megatron, no vLLM. The strategies, the reward pool,
the metrics, the trace and the run checkpoints are the real ones."""

from __future__ import annotations

import json
import signal
import time
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import pytest

from megatron_pc.allocation.check import check_trace
from megatron_pc.allocation.trace import read_trace
from megatron_pc.driver.prepare import RunData
from megatron_pc.driver.faults import ENV, PHASES, Fault, parse
from megatron_pc.driver.checkpoints import PREEMPTION_SIGNALS
from megatron_pc.driver.trainer import Trainer
from megatron_pc.errors import ConfigError
from megatron_pc.config import load_config
from megatron_pc.data.records import PromptRecord
from megatron_pc.metrics.logger import read_metrics
from standins import StandInWorkers


class DigitTokenizer:
    """Token t decodes to the digit t % 10."""

    def batch_decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        return ["".join(str(t % 10) for t in row) for row in ids]


def _data(tmp_path: Path) -> RunData:
    # Answers 0, 1 and 2 are likely under the stand-in policy (small token ids are likelier),
    # 7..9 rare, so prompts spread from easy to hard.
    train = [PromptRecord(f"p{i}", f"q{i}", str(i % 10)) for i in range(40)]
    val = [PromptRecord(f"v{i}", f"v{i}", str(i % 10)) for i in range(10)]
    return RunData(tmp_path / "model", DigitTokenizer(), train, val, [[1, 2, 3 + i % 5] for i in range(40)], [[4, 5] for _ in range(10)])


def _cfg(tmp_path: Path, strategy: str, *overrides: str):
    return load_config(None, [
        f"allocation.strategy={strategy}", "allocation.train_batch=4", "allocation.n=8", "allocation.pilot.n=2",
        "allocation.pilot.batch=8", "allocation.dapo_batch=4", "allocation.on_round_limit=train_partial",
        "training.steps=4", "training.mini_batch=2", "training.validate_every=2", "training.save_every=2",
        "training.val_samples=1", f"run_dir={tmp_path / strategy}", *overrides,
    ])  # fmt: skip


@pytest.mark.parametrize("strategy", ["pilot_commit", "grpo", "dapo", "speed_rl", "greso", "mopps"])
def test_the_loop_trains_validates_checkpoints_and_accounts_without_ray(tmp_path: Path, strategy: str) -> None:
    cfg = _cfg(tmp_path, strategy)
    made: list[StandInWorkers] = []
    trainer = Trainer(cfg, _data(tmp_path), lambda *a: made.append(StandInWorkers(*a)) or made[-1])
    last = trainer.run()
    rows = read_metrics(cfg.resolved_run_dir / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert all("val_accuracy" in r for r in rows if r["step"] in (0, 2, 4))
    trained = [r for r in rows[1:] if r.get("updates")]
    assert trained and all(r["updates"] >= 1 and r["logprob_gap"] == pytest.approx(0.0, abs=1e-6) for r in trained)
    faults = ("engine_restarts", "reward_timeouts", "reward_errors", "reward_worker_restarts")
    assert all(r[k] == 0 for r in rows[1:] for k in faults)
    # old log-probs once per step, on the stand-in ranks
    policy = made[0].policy
    assert policy.logprob_calls == len(trained) and policy.model.schedule_steps == len(trained)
    assert last["cum_generated"] == sum(r["generated"] for r in rows[1:])
    assert check_trace(read_trace(cfg.resolved_run_dir / "trace.jsonl"), cfg.allocation) == []
    assert sorted(p.name for p in (cfg.resolved_run_dir / "checkpoints").iterdir() if p.is_dir())[-1].endswith("4")
    assert made[0].closed


@pytest.mark.parametrize("strategy", ["pilot_commit", "grpo"])
def test_a_rollout_budget_stops_the_run_and_validation_follows_the_rollout_schedule(tmp_path: Path, strategy: str) -> None:
    # A budget of 200 rollouts, validation every 64: GRPO spends 32 a step, Pilot-Commit more.
    cfg = _cfg(tmp_path, strategy, "training.steps=50", "training.rollout_budget=200", "training.validate_every_rollouts=64")
    Trainer(cfg, _data(tmp_path), partial(StandInWorkers)).run()
    rows = read_metrics(cfg.resolved_run_dir / "metrics.jsonl")
    steps = [r for r in rows if r["step"] > 0]
    assert steps[-1]["cum_generated"] >= 200 > steps[-1]["cum_generated"] - steps[-1]["generated"]  # stopped at the step that spent it
    validated = [r["step"] for r in rows if "val_accuracy" in r]
    crossing = [r["step"] for r in steps if r["cum_generated"] // 64 > (r["cum_generated"] - r["generated"]) // 64]
    assert validated == sorted({0, *crossing, steps[-1]["step"]})
    checkpoints = sorted(p.name for p in (cfg.resolved_run_dir / "checkpoints").iterdir() if p.is_dir())
    assert checkpoints[-1].endswith(str(steps[-1]["step"]))
    # Run again: the budget is spent, nothing more is trained.
    Trainer(cfg, _data(tmp_path), partial(StandInWorkers)).run()
    assert read_metrics(cfg.resolved_run_dir / "metrics.jsonl") == rows


def test_a_resumed_loop_continues_from_the_checkpoint(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "pilot_commit")
    full: list[StandInWorkers] = []
    Trainer(cfg, _data(tmp_path), lambda *a: full.append(StandInWorkers(*a)) or full[-1]).run()
    first = read_metrics(cfg.resolved_run_dir / "metrics.jsonl")
    # Again in a new directory: 2 steps, then 2 more resumed from the step-2 checkpoint.
    other = _cfg(tmp_path / "again", "pilot_commit", "training.steps=2")
    Trainer(other, _data(tmp_path), partial(StandInWorkers)).run()
    resumed: list[StandInWorkers] = []
    more = _cfg(tmp_path / "again", "pilot_commit")
    Trainer(more, _data(tmp_path), lambda *a: resumed.append(StandInWorkers(*a)) or resumed[-1]).run()
    second = read_metrics(more.resolved_run_dir / "metrics.jsonl")
    keys = ("generated", "cum_generated", "reward_mean", "loss", "val_accuracy")
    assert [[r.get(k) for k in keys] for r in second] == [[r.get(k) for k in keys] for r in first]
    assert read_trace(more.resolved_run_dir / "trace.jsonl") == read_trace(cfg.resolved_run_dir / "trace.jsonl")
    state = json.loads((more.resolved_run_dir / "checkpoints").joinpath(sorted(p.name for p in (more.resolved_run_dir / "checkpoints").iterdir() if p.is_dir())[-1], "policy", "theta.json").read_text())
    assert state["steps"] == resumed[0].policy.model.schedule_steps


@contextmanager
def kept_signal_handlers():
    """The preemption signals' handlers as they were before a Trainer installed its own."""
    previous = {sig: signal.getsignal(sig) for sig in PREEMPTION_SIGNALS}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _keys(rows: list[dict]) -> list[list]:
    return [[r.get(k) for k in ("generated", "cum_generated", "reward_mean", "loss", "val_accuracy")] for r in rows]


def test_an_engine_that_dies_is_restarted_with_the_policys_weights_and_its_round_replayed(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, "pilot_commit")
    Trainer(cfg, _data(tmp_path), partial(StandInWorkers)).run()
    straight = read_metrics(cfg.resolved_run_dir / "metrics.jsonl")

    faulty = _cfg(tmp_path / "faulty", "pilot_commit")
    made: list[StandInWorkers] = []
    # The first engine dies in its 6th generate call (a round of step 2), after a training step.
    Trainer(faulty, _data(tmp_path), lambda *a: made.append(StandInWorkers(*a, dies_at_call=[6])) or made[-1]).run()
    rows = read_metrics(faulty.resolved_run_dir / "metrics.jsonl")
    assert made[0].made == 2 and sum(r.get("engine_restarts", 0) for r in rows) == 1
    # The replayed round is the one that failed: nothing counted twice, the same run.
    assert _keys(rows) == _keys(straight)
    assert read_trace(faulty.resolved_run_dir / "trace.jsonl") == read_trace(cfg.resolved_run_dir / "trace.jsonl")
    # The new engine got the trained weights (else its log-probs would not match the trainer's).
    assert all(r["logprob_gap"] == pytest.approx(0.0, abs=1e-6) for r in rows[1:] if r.get("updates"))
    assert made[0].engines.engines[0].theta == made[0].policy.theta


def test_an_engine_that_keeps_dying_stops_the_run_with_an_error_naming_it(tmp_path: Path) -> None:
    from megatron_pc.errors import MegatronPCError

    cfg = _cfg(tmp_path, "grpo", "rollout.engine_restarts=2", "training.save_every=1")
    made: list[StandInWorkers] = []
    # Dies in its 6th call (step 2, after step 1's checkpoint), and every restarted engine in its first.
    workers = lambda *a: made.append(StandInWorkers(*a, dies_at_call=[6, 1, 1, 1])) or made[-1]  # noqa: E731
    with pytest.raises(MegatronPCError, match=r"engine0 died again during generation after 2 restarts in a row \(rollout.engine_restarts 2\)"):
        Trainer(cfg, _data(tmp_path), workers).run()
    assert made[0].made == 3 and made[0].closed
    # The checkpoints written before the failure are complete; none is half-written.
    ckpts = [p for p in (cfg.resolved_run_dir / "checkpoints").iterdir()]
    assert [p.name for p in ckpts] == ["step_00000001"] and (ckpts[0] / "MANIFEST.json").is_file()


def test_reward_faults_are_the_counts_of_the_step() -> None:
    from megatron_pc.reward.pool import reward_faults

    before = {"scored": 10, "timeout": 1, "worker_restarts": 1, "error:ValueError": 2}
    after = {"scored": 30, "timeout": 3, "worker_restarts": 4, "worker_died": 1, "error:ValueError": 2, "error:KeyError": 1, "correct": 5}
    assert reward_faults(before, after) == {"reward_timeouts": 2, "reward_errors": 2, "reward_worker_restarts": 3}


@pytest.mark.parametrize("faults", [f"sigterm@{p}:2" for p in PHASES] + ["sigterm@generate:2,sigterm@update:2+0.01"])
def test_sigterm_in_any_phase_of_a_step_finishes_the_step_checkpoints_and_resumes_exactly(tmp_path: Path, faults: str,
                                                                                         monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    straight = _cfg(tmp_path / "straight", "pilot_commit")
    Trainer(straight, _data(tmp_path), partial(StandInWorkers)).run()
    # The signal, not the schedule, saves step 2 (except in the checkpoint phase, which is the schedule's).
    cfg = _cfg(tmp_path / "term", "pilot_commit", f"training.save_every={2 if 'checkpoint' in faults else 3}")
    with kept_signal_handlers():
        monkeypatch.setenv(ENV, faults)
        trainer = Trainer(cfg, _data(tmp_path), partial(StandInWorkers))
        trainer.run()
        time.sleep(0.05)  # a delayed second signal lands after the step; it must change nothing
        assert trainer.preempted and not trainer.faults.pending
        assert [r["step"] for r in read_metrics(cfg.resolved_run_dir / "metrics.jsonl")] == [0, 1, 2]
        assert [p.name for p in (cfg.resolved_run_dir / "checkpoints").iterdir()] == ["step_00000002"]
        monkeypatch.delenv(ENV)
        Trainer(cfg, _data(tmp_path), partial(StandInWorkers)).run()
    run = cfg.resolved_run_dir
    assert _keys(read_metrics(run / "metrics.jsonl")) == _keys(read_metrics(straight.resolved_run_dir / "metrics.jsonl"))
    assert read_trace(run / "trace.jsonl") == read_trace(straight.resolved_run_dir / "trace.jsonl")


def test_a_bad_fault_spec_is_refused_naming_the_variable() -> None:
    assert parse("sigkill@checkpoint:3, sigterm@update:2+0.5") == [Fault("sigkill", "checkpoint", 3), Fault("sigterm", "update", 2, 0.5)]
    for bad in ("sigkill@nowhere:3", "sighup@update:1", "sigterm@update", "sigterm@update:x"):
        with pytest.raises(ConfigError, match=f"{ENV}.*{bad}"):
            parse(bad)


def test_the_screen_gets_its_features_from_the_driver_and_resumes_exactly(tmp_path: Path) -> None:
    screen = ("allocation.history.preset=screen", "allocation.history.min_fit=4", "allocation.history.ngram_dim=32")
    cfg = _cfg(tmp_path, "pilot_commit", *screen)
    Trainer(cfg, _data(tmp_path), partial(StandInWorkers)).run()
    first = read_metrics(cfg.resolved_run_dir / "metrics.jsonl")
    assert first[1]["screen_prompts"] > 0 and all("time_screen" in r for r in first[1:])
    assert sum(r["prompts_predicted"] for r in first[1:]) > 0
    trace = read_trace(cfg.resolved_run_dir / "trace.jsonl")
    assert check_trace(trace, cfg.allocation) == []
    assert any(e.get("predicted_p") is not None for e in trace if e["event"] in ("pilot", "direct", "screen"))
    # 2 steps, then 2 more resumed from the step-2 checkpoint: the same trace and screen figures.
    Trainer(_cfg(tmp_path / "again", "pilot_commit", *screen, "training.steps=2"), _data(tmp_path), partial(StandInWorkers)).run()
    more = _cfg(tmp_path / "again", "pilot_commit", *screen)
    Trainer(more, _data(tmp_path), partial(StandInWorkers)).run()
    second = read_metrics(more.resolved_run_dir / "metrics.jsonl")
    keys = ("generated", "screen_brier", "screen_auc", "share_screened", "prompts_predicted", "predictor_fit_weight")
    assert [[r.get(k) for k in keys] for r in second] == [[r.get(k) for k in keys] for r in first]
    assert read_trace(more.resolved_run_dir / "trace.jsonl") == trace


def _data_with_difficulty(tmp_path: Path) -> RunData:
    data = _data(tmp_path)
    train = [PromptRecord(r.id, r.prompt, r.answer, difficulty=float(int(r.answer) // 3)) for r in data.train]
    return RunData(data.model_path, data.tokenizer, train, data.val, data.train_tokens, data.val_tokens)


def test_metadata_priors_get_the_records_buckets_from_the_driver_and_resume_exactly(tmp_path: Path) -> None:
    meta = ("allocation.history.preset=metadata", "allocation.history.metadata=[difficulty]", "allocation.history.ngram_dim=32")
    cfg = _cfg(tmp_path, "pilot_commit", *meta)
    Trainer(cfg, _data_with_difficulty(tmp_path), partial(StandInWorkers)).run()
    first = read_metrics(cfg.resolved_run_dir / "metrics.jsonl")
    assert all(r["bucket_coverage"] > 0 for r in first[1:]) and sum(r["prompts_bucket_prior"] for r in first[1:]) > 0
    trace = read_trace(cfg.resolved_run_dir / "trace.jsonl")
    assert check_trace(trace, cfg.allocation) == []
    assert any(e.get("prior_source") == "metadata" for e in trace if e["event"] in ("pilot", "direct", "screen"))
    Trainer(_cfg(tmp_path / "again", "pilot_commit", *meta, "training.steps=2"), _data_with_difficulty(tmp_path), partial(StandInWorkers)).run()
    more = _cfg(tmp_path / "again", "pilot_commit", *meta)
    Trainer(more, _data_with_difficulty(tmp_path), partial(StandInWorkers)).run()
    second = read_metrics(more.resolved_run_dir / "metrics.jsonl")
    keys = ("generated", "bucket_coverage", "prompts_bucket_prior", "share_screened", "screen_brier")
    assert [[r.get(k) for k in keys] for r in second] == [[r.get(k) for k in keys] for r in first]
    assert read_trace(more.resolved_run_dir / "trace.jsonl") == trace
    # Sized counts through the real update path: groups of 2n are trained whole beside groups of n
    # (fresh prompts made worthless here, so that every direct prompt the posterior doubts gets 2n).
    sized = _cfg(tmp_path / "sized", "pilot_commit", *meta, "allocation.history.sized=true", "training.steps=8")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("megatron_pc.allocation.pilot_commit.PilotCommit._fresh_value", lambda self, fresh: 0.0)
        Trainer(sized, _data_with_difficulty(tmp_path), partial(StandInWorkers)).run()
    rows = read_metrics(sized.resolved_run_dir / "metrics.jsonl")
    sized_trace = read_trace(sized.resolved_run_dir / "trace.jsonl")
    assert check_trace(sized_trace, sized.allocation) == []
    large = [e for e in sized_trace if e["event"] == "train_group" and e["size"] == 16]
    assert sum(r["prompts_direct_large"] for r in rows[1:]) > 0 and large
    # Short pilots through the real update path: 2 pilots kept whole with 6 commits, beside full pilots of 4 with 4.
    short = _cfg(tmp_path / "short", "pilot_commit", *meta, "allocation.history.sized=true", "allocation.pilot.n=4",
                 "allocation.history.short_pilot=2", "training.steps=8")  # fmt: skip
    Trainer(short, _data_with_difficulty(tmp_path), partial(StandInWorkers)).run()
    rows = read_metrics(short.resolved_run_dir / "metrics.jsonl")
    short_trace = read_trace(short.resolved_run_dir / "trace.jsonl")
    assert check_trace(short_trace, short.allocation) == []
    after_short = {e["prompt"] for e in short_trace if e["event"] == "pilot" and e["n"] == 2 and e["decision"] == "keep"}
    commits = [e for e in short_trace if e["event"] == "commit" and e["prompt"] in after_short]
    assert sum(r["prompts_short_pilot"] for r in rows[1:]) > 0 and commits and all(e["n"] == 6 for e in commits)
    # A field no record carries is refused, naming it, before any worker starts.
    with pytest.raises(ConfigError, match="'grade'"):
        Trainer(_cfg(tmp_path / "bad", "pilot_commit", "allocation.history.preset=metadata", "allocation.history.metadata=[grade]"),
                _data_with_difficulty(tmp_path), partial(StandInWorkers))  # fmt: skip


def test_policy_features_in_a_pipelined_run_are_refused_before_workers_start(tmp_path: Path) -> None:
    # The policy ranks are busy with step t's update while step t+1's rounds are planned.
    cfg = _cfg(tmp_path, "pilot_commit", "allocation.history.preset=screen", "allocation.history.features=policy",
               "cluster.placement=split", "training.pipelined=true")  # fmt: skip
    started: list[StandInWorkers] = []
    with pytest.raises(ConfigError, match="allocation.history.features.*training.pipelined"):
        Trainer(cfg, _data(tmp_path), lambda *a: started.append(StandInWorkers(*a)) or started[-1]).run()
    assert not started
