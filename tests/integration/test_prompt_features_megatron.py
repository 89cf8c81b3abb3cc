"""The screen's prompt features (megatron_pc.training.prompt_features) are transformers' last hidden
state (after the final norm) at each prompt's last real token, through padding, micro-batches,
the pipeline's last stage and the DP split."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.models import VOCAB, make_hf_model
from megatron_helpers import job_prompt_features
from megatron_pc.training.prompt_features import assemble_features
from megatron_pc.training.launch import run_distributed

pytestmark = pytest.mark.integration


def hf_last_hidden(path: Path, prompts: list[list[int]]) -> torch.Tensor:
    """transformers' ``hidden_states[-1]`` at the last token of each prompt, run alone (no padding)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        return torch.stack([model(torch.tensor([p]), output_hidden_states=True).hidden_states[-1][0, -1] for p in prompts])


# CI runs the pipeline (PP = 2, the features on the last stage only); the long suite adds the
# DP split (PP x DP = 2 x 2) and TP (TP x PP = 2 x 2).
@pytest.mark.parametrize("tp,pp,world", [(1, 2, 2), pytest.param(1, 2, 4, marks=pytest.mark.long),
                                         pytest.param(2, 2, 4, marks=pytest.mark.long)])
def test_prompt_features_equal_transformers_last_hidden_state(tmp_path: Path, tp: int, pp: int, world: int) -> None:
    path = make_hf_model(tmp_path, "qwen2")
    gen = torch.Generator().manual_seed(5)
    # Lengths from 1 to 12 against a 24-token micro-batch budget: several batches, most rows padded.
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen).tolist() for n in (1, 9, 4, 12, 4, 7, 2)]
    reference = hf_last_hidden(path, prompts)
    parts = run_distributed(job_prompt_features, world, path, tp, pp, prompts, timeout_s=600)
    # One part per DP group, from the last stage's TP rank 0; the other ranks return None.
    assert sum(p is not None for p in parts) == world // (tp * pp)
    features, tokens = assemble_features(parts, len(prompts))
    assert features.shape == tuple(reference.shape) and features.dtype.name == "float32"
    assert tokens["tokens"] == sum(len(p) for p in prompts) < tokens["padded_tokens"]
    assert reference.std(dim=0).min() > 0.1  # prompts that differ, so a row in the wrong place shows
    assert (torch.from_numpy(features) - reference).abs().max().item() <= 1e-5
