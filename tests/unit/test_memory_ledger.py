"""The memory ledger in the driver's call order: the real Trainer, with stand-in workers that
book the memory model's terms at every call (ledger_standins.py), for each paper config's
layout on its GPUs. Every event must leave 10% of the device and of a node's host memory, and
the order the Trainer makes must be the one ``megatron-pc plan`` replays."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_pc.driver.trainer import Trainer
from megatron_pc.launch.ledger import Ledger, replay, run_events
from megatron_pc.launch.plan import _parser, layout_from_args, new_ledger, plan_layout, render
from ledger_standins import LedgerWorkers
from test_trainer_loop import _cfg, _data

PAPER = [("qwen2.5_math_1.5b", 1), ("qwen3_4b", 2), ("qwen3_8b", 4), ("qwen3_14b", 8)]


def _layout(name: str, nodes: int, *overrides: str):
    return layout_from_args(_parser().parse_intermixed_args([name, "--nodes", str(nodes), *overrides]))


def _run(tmp_path: Path, ledger: Ledger, steps: int, *overrides: str) -> Trainer:
    cfg = _cfg(tmp_path, "grpo", f"training.steps={steps}", "training.validate_every=1", "training.save_every=1", *overrides)
    trainer = Trainer(cfg, _data(tmp_path), lambda *a: LedgerWorkers(ledger, *a))
    trainer.run()
    return trainer


def _order(ledger: Ledger) -> tuple[str, ...]:
    """The booked events, a repeated event once (one call per rank, per mini-batch, per engine)."""
    events = [b.event for b in ledger.bookings]
    return tuple(e for k, e in enumerate(events) if k == 0 or events[k - 1] != e)


@pytest.mark.parametrize(("name", "nodes"), PAPER)
def test_every_event_of_a_fresh_and_a_resumed_run_leaves_ten_percent(tmp_path: Path, name: str, nodes: int) -> None:
    model, layout = _layout(name, nodes)
    fresh, resumed = new_ledger(model, layout), new_ledger(model, layout)
    _run(tmp_path, fresh, 1)
    _run(tmp_path, resumed, 2)  # resumes from step 1's checkpoint
    assert fresh.over() == [] and resumed.over() == []
    assert _order(fresh) == run_events(reference=False, resume=False)
    assert _order(resumed) == run_events(reference=False, resume=True)
    limit = 0.9 * layout.device.total_gib
    assert max(g.total for b in fresh.bookings + resumed.bookings for g in b.gpus) <= limit


def test_with_a_reference_model_the_order_has_its_log_probs_before_the_update(tmp_path: Path) -> None:
    model, layout = _layout("qwen3_14b", 8, "training.kl_coef=0.01")
    ledger = new_ledger(model, layout)
    _run(tmp_path, ledger, 1, "training.kl_coef=0.01")
    assert _order(ledger) == run_events(reference=True, resume=False)
    assert ledger.over() == []


def test_the_old_orders_of_resume_and_engine_start_do_not_fit_the_14b_layout() -> None:
    # Before the fix the engines started beside the fp32 grad buffer (RayWorkers.start, then
    # Trainer._load) and a resume synced into awake engines before the first offload.
    model, layout = _layout("qwen3_14b", 8)
    old = ("policy start", "engine start", "resume load", "sync", "offload")
    over = replay(new_ledger(model, layout), old).over()
    assert [p.split(" (")[0] for p in over] == ["event engine start", "event resume load", "event sync"]
    sync = [b for b in replay(new_ledger(model, layout), old).bookings if b.event == "sync"][0]
    assert sync.gpus[0].total == pytest.approx(138.8, abs=0.1)  # of 140.4 GiB


def test_sleep_level_1_would_pin_every_engines_weights_in_host_memory() -> None:
    from dataclasses import replace

    model, layout = _layout("qwen3_14b", 8)
    level1 = Ledger(model, replace(layout.memory_inputs(), sleep_level=1), layout.device.total_gib, layout.host_memory_gib, 8, 8)
    asleep = [b for b in replay(level1, run_events(False, False)).bookings if b.event == "sleep"][0]
    pinned = {t.name: t.gib for t in asleep.host.terms}["vLLM weights asleep (pinned)"]
    assert pinned == pytest.approx(8 * model.total_params * 2 / 2 / 2**30)  # 110 GiB a node
    level2 = [b for b in replay(new_ledger(model, layout), run_events(False, False)).bookings if b.event == "sleep"][0]
    assert "vLLM weights asleep (pinned)" not in {t.name for t in level2.host.terms}


def test_plan_prints_the_peak_event() -> None:
    model, layout = _layout("qwen3_14b", 8)
    report = plan_layout(model, layout)
    assert report.fits and report.peak_event is not None and report.peak_event.event == "sync"
    assert "peak event of a run in call order" in render(report) and ": sync: GPU 108.7 GiB = 77%" in render(report)
