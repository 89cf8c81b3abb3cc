"""HF weights loaded into the Megatron model give the logits of transformers (fp32)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.models import VOCAB, make_hf_model
from megatron_helpers import hf_logits, job_full_logits
from megatron_pc.training.launch import run_distributed

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("model_type,tie", [("llama", True), ("qwen2", False), ("qwen3", False)])
def test_megatron_logits_match_transformers_at_tp1_and_tp2(tmp_path: Path, model_type: str, tie: bool) -> None:
    path = make_hf_model(tmp_path, model_type, tie=tie)
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(3))
    reference = hf_logits(path, ids)
    assert reference.abs().max() > 0.1  # a non-trivial model
    for tp in (1, 2):
        logits = run_distributed(job_full_logits, tp, path, tp, ids, timeout_s=300)[0]
        assert logits.shape == reference.shape
        assert (logits - reference).abs().max().item() <= 1e-4, f"TP={tp}"
