"""The LR schedule counts training steps, not optimizer updates (real Megatron-Core on gloo)."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from helpers.models import make_hf_model, random_sequences
from megatron_helpers import job_schedule
from megatron_pc.training.launch import run_distributed

pytestmark = pytest.mark.integration
LR, WARMUP, STEPS = 1e-3, 4, 3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_model(tmp_path_factory.mktemp("hf"), "qwen2", layers=1)


def _run(model_dir: Path, updates_per_step: int) -> dict:
    job = partial(job_schedule, lr=LR, warmup_steps=WARMUP, dual_clip=10.0)
    return run_distributed(job, 1, model_dir, updates_per_step, STEPS, random_sequences(8), timeout_s=300)[0]


def test_lr_after_step_k_is_the_same_for_one_and_for_four_mini_batches(model_dir: Path) -> None:
    one, four = _run(model_dir, 1), _run(model_dir, 4)
    assert one["step"] == four["step"] == STEPS
    assert one["lr_next"] == pytest.approx(four["lr_next"], rel=1e-12)
    assert one["lr_next"] == pytest.approx(LR * STEPS / WARMUP)  # linear warm-up over training steps
    # Every update of step k uses step k's rate: 0, lr/4, lr/2 for the first three steps.
    assert one["lr_used"] == pytest.approx([LR * k / WARMUP for k in range(STEPS)])
    assert four["lr_used"] == pytest.approx([LR * k / WARMUP for k in range(STEPS) for _ in range(4)])
    # Old log-probs once per step: the ratio is 1 at each step's first update and moves after it.
    firsts = [m for i, m in enumerate(four["metrics"]) if i % 4 == 0]
    laters = [m for i, m in enumerate(four["metrics"]) if i % 4 and m["lr"] > 0]
    assert all(m["ratio_mean"] == pytest.approx(1.0, abs=1e-6) and m["approx_kl"] == pytest.approx(0.0, abs=1e-9) for m in firsts)
    assert any(m["approx_kl"] > 1e-8 for m in laters)
    for m in four["metrics"]:
        assert {"clip_frac_low", "clip_frac_high", "dual_clip_frac", "ratio_mean", "approx_kl", "entropy"} <= set(m)
        assert m["entropy"] > 0
