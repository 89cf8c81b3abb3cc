"""The settings the paper configs resolve to on a GPU, executed here at tiny widths (the list of
settings and what covers each is tests/unit/test_gpu_settings.py).

Two runs of four gloo processes, from the same tiny Qwen3 (qk-norm, GQA), against TP 1 with
Megatron's local spec and no SP:
- TP 2 x DP 2, as the 8B and 14B configs: sequence parallelism, our layer spec, bf16 parameters,
  the distributed optimizer, offload before generation, and the cuda_ipc sender's export (every
  rank gathers the full tensors within its TP group);
- TP 2 x PP 2: the same with fp32 parameters across two pipeline stages and rank 0's export.
The pushed tensors are loaded into transformers' model as an engine loads them: its log-probs
equal the policy's."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.models import make_hf_model, random_sequences
from megatron_pc.training.launch import run_distributed
from sp_helpers import job_gpu_settings, job_sp_run

pytestmark = pytest.mark.integration


def _max_diff(a: list, b: list) -> float:
    return max((x[0].float() - y[0].float()).abs().max().item() for x, y in zip(a, b))


def _engine_logprobs(path: Path, pushed: dict[str, torch.Tensor], seqs: list) -> list[torch.Tensor]:
    """Response log-probs of transformers' model holding the pushed tensors (fp32)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="eager")
    missing, unexpected = model.load_state_dict(pushed, strict=False)
    assert not unexpected and all(name == "lm_head.weight" and model.config.tie_word_embeddings for name in missing), missing
    out = []
    with torch.no_grad():
        for seq in seqs:
            ids = torch.tensor([seq.tokens])
            logp = torch.log_softmax(model(ids).logits[0, :-1].float(), -1).gather(-1, ids[0, 1:, None])[:, 0]
            out.append(logp[seq.prompt_len - 1 :])
    return out


@pytest.fixture(scope="module")
def model_and_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list, dict]:
    path = make_hf_model(tmp_path_factory.mktemp("gpu_settings"), "qwen3")
    seqs = random_sequences(8, seed=4)
    return path, seqs, run_distributed(job_sp_run, 1, path, 1, 1, seqs, False, "local", timeout_s=600)[0]


@pytest.mark.parametrize("tp,pp,dtype,every_rank,tol", [(2, 1, "bfloat16", True, 0.06), (2, 2, "float32", False, 2e-5)],
                         ids=["tp2_dp2_sp_bf16_cuda_ipc_export", "tp2_pp2_sp_fp32"])
def test_paper_gpu_settings_run_at_tiny_widths(model_and_reference: tuple[Path, list, dict], tp: int, pp: int, dtype: str,
                                               every_rank: bool, tol: float) -> None:
    path, seqs, ref = model_and_reference
    ranks = run_distributed(job_gpu_settings, 4, path, tp, pp, seqs, dtype, every_rank, timeout_s=900)
    for rank in ranks:
        assert rank["modules"] == "megatron_pc.models.layer_specs.SdpaAttention"
        assert rank["offloaded"] == ["grads", "optimizer"] if dtype == "bfloat16" else "grads" in rank["offloaded"]
        assert _max_diff(rank["before"], ref["before"]) <= tol
        assert _max_diff(rank["after"], ref["before"]) > 1e-3  # the update moved the policy
    if pp == 1:  # DP 2: the distributed optimizer
        assert set(ranks[0]["optimizers"]) == {"DistributedOptimizer"}
    # Who pushes: every rank (cuda_ipc: each feeds the engine worker on its GPU) or rank 0.
    pushers = [r for r in ranks if r["pushed"]]
    assert len(pushers) == (4 if every_rank else 1)
    for rank in pushers:
        assert rank["pushed"].keys() == ranks[0]["pushed"].keys()
        for name, tensor in ref["exported"].items():
            if name in rank["pushed"]:
                # The push is before the update: the loaded weights, through this layout's export.
                original = ref["exported"][name]
                assert rank["pushed"][name].shape == original.shape, name
    engine = _engine_logprobs(path, pushers[0]["pushed"], seqs)
    assert max((e - b[0].float()).abs().max().item() for e, b in zip(engine, pushers[0]["before"])) <= tol
