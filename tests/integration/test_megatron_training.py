"""Policy worker on real Megatron-Core over gloo: parallel layouts agree, the update moves
log-probs the right way, checkpoints reshard and resume exactly."""

from __future__ import annotations

from functools import partial
from pathlib import Path
from typing import Any

import pytest

from helpers.models import make_hf_model, random_sequences
from megatron_helpers import job_logprobs, job_train, job_train_shares
from megatron_pc.training.launch import run_distributed

pytestmark = pytest.mark.integration
LR = 3e-4


def _max_diff(a: list, b: list) -> float:
    return max((x[0] - y[0]).abs().max().item() for x, y in zip(a, b))


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_model(tmp_path_factory.mktemp("hf"), "qwen2", layers=2)


@pytest.fixture(scope="module")
def dp1_step(model_dir: Path) -> dict[str, Any]:
    """One step at TP = PP = DP = 1 on the toy batch."""
    return run_distributed(partial(job_train, lr=LR), 1, model_dir, 1, 1, random_sequences(), 1, timeout_s=300)[0]


@pytest.fixture(scope="module")
def tp2_run(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Three steps at TP=2, checkpointed after the first."""
    ckpt = tmp_path_factory.mktemp("ckpt") / "step1"
    out = run_distributed(partial(job_train, lr=LR), 2, model_dir, 2, 1, random_sequences(), 3, 1, ckpt, timeout_s=300)
    return {"ckpt": ckpt, **out[0]}


@pytest.fixture(scope="module")
def tp2_resumed(model_dir: Path, tp2_run: dict[str, Any]) -> dict[str, Any]:
    """Two steps at TP=2 resumed from the step-1 checkpoint, with the same old log-probs."""
    job = partial(job_train, lr=LR, resume=tp2_run["ckpt"], old=tp2_run["before"])
    return run_distributed(job, 2, model_dir, 2, 1, random_sequences(), 2, timeout_s=300)[0]


def test_tp2_logprobs_match_tp1(model_dir: Path) -> None:
    seqs = random_sequences()
    tp1 = run_distributed(job_logprobs, 1, model_dir, 1, 1, seqs, timeout_s=300)[0]
    tp2 = run_distributed(job_logprobs, 2, model_dir, 2, 1, seqs, timeout_s=300)
    assert [len(lp) for lp, _ in tp1] == [s.response_len for s in seqs]
    assert _max_diff(tp1, tp2[0]) <= 1e-5 and _max_diff(tp1, tp2[1]) <= 1e-5
    assert max((a[1] - b[1]).abs().max().item() for a, b in zip(tp1, tp2[0])) <= 1e-5  # entropy


def test_positive_advantage_gains_logprob_and_negative_loses(dp1_step: dict[str, Any]) -> None:
    for seq, before, after in zip(random_sequences(), dp1_step["before"], dp1_step["after"]):
        change = (after[0] - before[0]).sum().item()
        assert change > 0 if seq.advantage > 0 else change < 0, (seq.advantage, change)


def test_dp2_distributed_optimizer_step_matches_dp1(model_dir: Path, dp1_step: dict[str, Any]) -> None:
    dp2 = run_distributed(partial(job_train, lr=LR), 2, model_dir, 1, 1, random_sequences(), 1, timeout_s=300)
    assert abs(dp2[0]["losses"][0] - dp1_step["losses"][0]) <= 1e-5
    assert _max_diff(dp1_step["after"], dp2[0]["after"]) <= 1e-5
    assert _max_diff(dp1_step["after"], dp2[1]["after"]) <= 1e-5


def test_resume_from_checkpoint_continues_bit_identically(tp2_run: dict[str, Any], tp2_resumed: dict[str, Any]) -> None:
    assert tp2_resumed["losses"] == tp2_run["losses"][1:]
    assert len(set(tp2_run["losses"])) > 1  # the losses move, so equality means something
    assert _max_diff(tp2_run["after"], tp2_resumed["after"]) == 0.0


def test_checkpoint_saved_at_tp2_loads_at_tp1_and_at_pp2_with_same_logprobs(
        model_dir: Path, tp2_run: dict[str, Any], tp2_resumed: dict[str, Any]) -> None:
    seqs, ckpt = random_sequences(), tp2_run["ckpt"]
    at_save = tp2_resumed["before"]  # TP=2 log-probs right after loading the step-1 checkpoint
    assert _max_diff(at_save, tp2_run["before"]) > 1e-4  # the checkpoint is not the HF model
    tp1 = run_distributed(job_logprobs, 1, model_dir, 1, 1, seqs, ckpt, timeout_s=300)[0]
    pp2 = run_distributed(job_logprobs, 2, model_dir, 1, 2, seqs, ckpt, timeout_s=300)
    assert _max_diff(at_save, tp1) <= 1e-5
    assert _max_diff(tp1, pp2[0]) <= 1e-5 and _max_diff(tp1, pp2[1]) <= 1e-5


def test_dp2_trained_on_token_balanced_shares_matches_dp1(model_dir: Path) -> None:
    """The driver's path (megatron_pc.driver.update): each DP group holds only its share, and
    the update equals the one at DP=1 on the whole batch."""
    seqs = random_sequences()
    one = run_distributed(partial(job_train, lr=1e-3), 1, model_dir, 1, 1, random_sequences(), 2, timeout_s=300)[0]
    two = run_distributed(job_train_shares, 2, model_dir, 1, seqs, 2, timeout_s=300)
    assert sum(r["rows"] for r in two) == len(seqs) and min(r["rows"] for r in two) > 0
    assert two[0]["losses"] == pytest.approx(one["losses"], abs=1e-5)
    assert _max_diff(one["after"], two[0]["after"]) <= 1e-5 and _max_diff(one["after"], two[1]["after"]) <= 1e-5
