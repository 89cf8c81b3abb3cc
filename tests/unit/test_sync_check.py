"""The sync check after each weight push: thresholds by precision, a warning with the figure
over the first, the run stopped (naming the engine) on a clear break. The loop runs with the
in-process stand-ins of test_trainer_loop; only the engine's scores are shifted."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Sequence

import pytest

from megatron_pc.config import load_config
from megatron_pc.driver.sync_check import SyncCheck, pair_precision
from megatron_pc.driver.trainer import Trainer
from megatron_pc.errors import ConfigError, MegatronPCError
from megatron_pc.metrics.logger import read_metrics
from megatron_pc.rollout.config import RolloutConfig
from standins import StandInEngine, StandInWorkers
from test_trainer_loop import _cfg, _data


class ShiftedEngine(StandInEngine):
    """Scores every token ``shift`` nats above the trainer (weights that did not land exactly)."""

    shift = 0.0

    def score(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        return [[v + self.shift for v in row] for row in super().score(sequences)]


def _workers(shift: float) -> Any:
    class Shifted(StandInWorkers):
        def _engine(self, k: int) -> StandInEngine:
            self.made += 1
            engine = ShiftedEngine(f"engine{k}")
            engine.shift = shift
            return engine

    return Shifted


def _fp32_cfg(tmp_path: Path, *more: str):
    # fp32 on both sides: the trainer on CPU (params auto), the engine by rollout.dtype.
    return _cfg(tmp_path, "grpo", "rollout.dtype=float32", *more)


def test_thresholds_follow_the_precision_of_trainer_and_engine(tmp_path: Path) -> None:
    assert pair_precision("auto", "float32", use_gpu=False, model_path=str(tmp_path)) == "fp32"
    assert pair_precision("auto", "float32", use_gpu=True, model_path=str(tmp_path)) == "bf16"  # auto on GPU is bf16
    assert pair_precision("float32", "bfloat16", use_gpu=False, model_path=str(tmp_path)) == "bf16"
    (tmp_path / "config.json").write_text('{"torch_dtype": "float32"}')
    assert pair_precision("auto", "auto", use_gpu=False, model_path=str(tmp_path)) == "fp32"  # the checkpoint's dtype
    cfg = RolloutConfig()
    assert cfg.gap_warn("fp32") == 1e-3 and cfg.gap_warn("bf16") == 0.1
    assert RolloutConfig(logprob_gap_warn=0.2).gap_warn("fp32") == 0.2


def test_a_gap_over_the_warning_threshold_is_a_warning_with_the_figure(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _fp32_cfg(tmp_path)
    with caplog.at_level(logging.WARNING, logger="megatron_pc.driver.sync_check"):
        Trainer(cfg, _data(tmp_path), _workers(0.005)).run()
    rows = [r for r in read_metrics(cfg.resolved_run_dir / "metrics.jsonl") if r.get("updates")]
    assert rows and all(r["logprob_gap"] == pytest.approx(0.005, abs=1e-6) for r in rows)
    warned = [r.getMessage() for r in caplog.records if "log-prob gap" in r.getMessage()]
    assert len(warned) == len(rows) and "engine engine0 mean |log-prob gap| 0.005" in warned[0] and "fp32 threshold 0.001" in warned[0]


def test_the_same_gap_is_quiet_under_bf16_thresholds(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _cfg(tmp_path, "grpo", "rollout.dtype=bfloat16")
    with caplog.at_level(logging.WARNING, logger="megatron_pc.driver.sync_check"):
        Trainer(cfg, _data(tmp_path), _workers(0.05)).run()
    assert not [r for r in caplog.records if "log-prob gap" in r.getMessage()]


def test_a_gap_over_the_hard_limit_stops_the_run_at_the_first_check_naming_the_engine(tmp_path: Path) -> None:
    cfg = _fp32_cfg(tmp_path)
    with pytest.raises(MegatronPCError, match=r"step 1: after the weight sync engine engine0 and the trainer disagree: mean \|log-prob gap\| 2 > rollout.logprob_gap_break 1"):
        Trainer(cfg, _data(tmp_path), _workers(2.0)).run()


def test_gaps_far_over_the_threshold_in_consecutive_checks_stop_the_run(tmp_path: Path) -> None:
    cfg = _fp32_cfg(tmp_path, "rollout.logprob_gap_strikes=2")
    with pytest.raises(MegatronPCError, match=r"step 2: engine engine0's mean \|log-prob gap\| was over 0.01 .* in 2 checks in a row, now 0.03"):
        Trainer(cfg, _data(tmp_path), _workers(0.03)).run()
    assert [r["step"] for r in read_metrics(cfg.resolved_run_dir / "metrics.jsonl")] == [0, 1]


def test_a_good_check_clears_the_strikes() -> None:
    check = SyncCheck(RolloutConfig(logprob_gap_strikes=2), "fp32")
    for step, gap in enumerate([0.05, 1e-6, 0.05, 1e-6, 0.05], start=1):
        check.judge(step, {"engine3": gap})
    with pytest.raises(MegatronPCError, match="engine engine3's mean"):
        check.judge(6, {"engine3": 0.05})
    with pytest.raises(MegatronPCError, match="engine engine1 and the trainer disagree: mean \\|log-prob gap\\| nan"):
        check.judge(7, {"engine1": float("nan")})


@pytest.mark.parametrize("field, value", [("logprob_gap_warn", "0"), ("logprob_gap_strikes", "0"), ("logprob_gap_break", "-1")])
def test_sync_check_settings_out_of_range_are_refused_naming_the_field(field: str, value: str) -> None:
    with pytest.raises(ConfigError, match=f"rollout.{field}"):
        load_config(None, [f"rollout.{field}={value}"])
