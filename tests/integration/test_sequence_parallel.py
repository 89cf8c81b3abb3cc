"""Sequence parallelism at TP 2 over gloo, the GPU default at TP > 1 (training.sequence_parallel).

Megatron-Core's local layer spec (the one it builds without Transformer Engine) normalises with
``WrappedTorchNorm``, which asserts ``not config.sequence_parallel``: the documented pip path
could not build the 14B policy. ``model.layer_spec=sdpa`` (megatron_pc/models/layer_specs.py)
builds it: an RMSNorm whose gradient Megatron sums over TP, and torch's SDPA as core attention.
Its log-probs, update and export at TP 2 with SP equal Megatron's local spec at TP 1."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.models import make_hf_model, random_sequences
from megatron_pc.training.launch import run_distributed
from sp_helpers import job_build_reference, job_sp_run

pytestmark = pytest.mark.integration

TOL = 2e-5
LR = 1e-3
"""tests/integration/megatron_helpers.py: train_cfg's learning rate."""


def test_megatron_local_spec_with_sequence_parallelism_is_refused_before_the_model_is_built(tmp_path: Path) -> None:
    path = make_hf_model(tmp_path, "qwen3")
    with pytest.raises(RuntimeError, match=r"LayerSpecError: model.layer_spec=local .*cannot run sequence parallelism.*"
                                           r"Transformer Engine.*docker/Dockerfile.*install.sh --gpu"):
        run_distributed(job_build_reference, 2, path, 2, True, "local", timeout_s=600)


def _max_diff(a: list, b: list) -> float:
    return max((x[0] - y[0]).abs().max().item() for x, y in zip(a, b))


def test_our_spec_at_tp2_with_sequence_parallelism_equals_tp1_local_spec(tmp_path: Path) -> None:
    path = make_hf_model(tmp_path, "qwen3")
    seqs = random_sequences(6, seed=3)
    ref = run_distributed(job_sp_run, 1, path, 1, 1, seqs, False, "local", timeout_s=600)[0]
    sp = run_distributed(job_sp_run, 2, path, 2, 1, seqs, True, "auto", timeout_s=600)
    # Megatron's local spec at TP 1 (WrappedTorchNorm makes a torch RMSNorm); ``auto`` with
    # sequence parallelism and no TE: ours.
    assert ref["modules"] == ("torch.nn.modules.normalization.RMSNorm",
                              "megatron.core.transformer.dot_product_attention.DotProductAttention")
    assert sp[0]["modules"] == ("megatron_pc.models.layer_specs.RMSNorm", "megatron_pc.models.layer_specs.SdpaAttention")
    for rank in sp:
        assert _max_diff(rank["before"], ref["before"]) <= TOL
        assert _max_diff(rank["after"], ref["after"]) <= TOL
        assert rank["loss"] == pytest.approx(ref["loss"], abs=TOL)
        assert rank["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-4)
        # The norms' gradients: each rank's is the sum over both sequence shards, as at TP 1.
        assert rank["norm_grads"].keys() == ref["norm_grads"].keys() and len(ref["norm_grads"]) == 2 * 4 + 1
        for name, grad in ref["norm_grads"].items():
            assert grad.abs().max() > 1e-4, name
            torch.testing.assert_close(rank["norm_grads"][name], grad, atol=TOL, rtol=1e-4, msg=name)
    # The update moved the policy, and the export after it equals TP 1's, tensor for tensor. Adam's
    # first step is about lr x sign(grad): where a gradient is ~0 the two layouts' rounding may give
    # opposite signs, so a few elements may differ by up to 2 lr; all others agree within TOL.
    assert _max_diff(ref["before"], ref["after"]) > 1e-3
    assert sp[0]["exported"].keys() == ref["exported"].keys()
    for name, tensor in ref["exported"].items():
        diff = (sp[0]["exported"][name] - tensor).abs()
        off = (diff > TOL).float().mean().item()
        assert diff.max().item() <= 2.05 * LR and off <= 0.01, f"{name}: max {diff.max().item():.2e}, share off {off:.4f}"
    assert sp[1]["exported"] == {}
