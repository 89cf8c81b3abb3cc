"""The Megatron policy on one GPU: Transformer Engine layer spec when TE is installed (our
sdpa spec otherwise, megatron_pc/models/layer_specs.py), bf16 parameters by default, log-probs that match transformers in bf16
for Llama, Qwen2 and Qwen3 (qk-norm), a bf16 train step (fp32 main parameters) that moves the
weights, and the export to HF names (what the weight sync sends) and back, bit for bit.

Runs in the pytest process on a world of one rank (NCCL on a free port). Skipped without
CUDA by tests/conftest.py; everything imported at module level imports without CUDA.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers.models import bits as _bits
from helpers.models import make_hf_model, random_sequences
from helpers.tiny import tiny_training
from megatron_pc import platform
from megatron_pc.models.config import ModelConfig
from megatron_pc.models.provider import transformer_engine_available
from megatron_pc.training.batching import Sequence
from megatron_pc.training.config import TrainingConfig
from megatron_pc.training.launch import free_port

pytestmark = pytest.mark.gpu

TOLERANCE = 2e-2
"""Mean |log-prob difference| allowed between Megatron and transformers, both in bf16. Two
bf16 implementations of the same 2-layer model differ by ~5e-3 here (bf16 keeps 8 bits of
mantissa, and the fused kernels round at other points); a mis-mapped weight gives ~1."""
INIT_RANGE = 0.05
"""Spreads the log-probs (std ~0.5) well beyond the tolerance, so matching within it says something."""
LR = 1e-3
"""Large enough that one Adam step shows through bf16 rounding of the model weights."""


def _sequences(n: int = 8) -> list[Sequence]:
    """Prompts of 4-12 and responses of 4-20 tokens, advantages of both signs."""
    return random_sequences(n, prompt=(4, 13), response=(4, 21))


def _hf_logprobs(path: Path, seqs: list[Sequence]) -> list[torch.Tensor]:
    """Response log-probs under transformers in bf16 on this process's device (eager attention,
    one sequence at a time so no padding or mask is involved)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16,
                                                              attn_implementation="eager").to(platform.device())
    out = []
    with torch.no_grad():
        for seq in seqs:
            ids = torch.tensor([seq.tokens], device=platform.device())
            logprobs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
            span = range(seq.prompt_len - 1, len(seq.tokens) - 1)
            out.append(torch.stack([logprobs[t, seq.tokens[t + 1]] for t in span]).cpu())
    return out


def _model_cfg(path: Path) -> ModelConfig:
    # params_dtype "auto" on purpose: bf16 must be what a GPU run gets without asking.
    return ModelConfig(path=str(path), tensor_parallel=1, pipeline_parallel=1, params_dtype="auto")


def _qkv_module(worker: object) -> torch.nn.Module:
    return worker.module.decoder.layers[0].self_attention.linear_qkv


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf_gpu")
    return {t: make_hf_model(root, t, initializer_range=INIT_RANGE) for t in ("llama", "qwen2", "qwen3")}


def test_provider_uses_transformer_engine_spec_and_bf16_params_when_te_is_installed(
        world: None, hf_dirs: dict[str, Path]) -> None:
    pytest.importorskip("transformer_engine.pytorch")
    from megatron_pc.training.worker import ReferenceWorker

    assert transformer_engine_available()
    worker = ReferenceWorker(_model_cfg(hf_dirs["qwen2"]))
    qkv = _qkv_module(worker)
    # TE fuses the input norm into the QKV projection (TELayerNormColumnParallelLinear).
    assert type(qkv).__module__.startswith("megatron.core.extensions.transformer_engine"), type(qkv)
    assert hasattr(qkv, "layer_norm_weight")
    params = list(worker.module.parameters())
    assert {p.dtype for p in params} == {torch.bfloat16}
    assert all(p.is_cuda for p in params)


def test_provider_falls_back_to_our_sdpa_spec_without_transformer_engine(
        world: None, hf_dirs: dict[str, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from megatron_pc.training.worker import ReferenceWorker

    # A None entry makes `import transformer_engine.pytorch` raise ImportError, as if absent.
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", None)
    assert not transformer_engine_available()
    worker = ReferenceWorker(_model_cfg(hf_dirs["qwen2"]))
    qkv = _qkv_module(worker)
    assert type(qkv).__module__ == "megatron.core.tensor_parallel.layers", type(qkv)
    # model.layer_spec auto on a GPU without TE: ours (megatron_pc/models/layer_specs.py), final norm included.
    assert type(worker.module.decoder.layers[0].self_attention.core_attention).__name__ == "SdpaAttention"
    assert not any("transformer_engine" in type(m).__module__ for m in worker.module.modules())
    # It must also load and run in bf16 on the GPU.
    worker.load_hf()
    seqs = _sequences(4)
    ours = [lp for lp, _ in worker.compute_logprobs(seqs)]
    diff = torch.cat([a - b for a, b in zip(ours, _hf_logprobs(hf_dirs["qwen2"], seqs))]).abs().mean().item()
    assert diff <= TOLERANCE


@pytest.mark.parametrize("model_type", ["llama", "qwen2", "qwen3"])
def test_bf16_logprobs_match_transformers_bf16(world: None, hf_dirs: dict[str, Path], model_type: str,
                                               record_figure: Callable[..., None]) -> None:
    from megatron_pc.training.worker import ReferenceWorker

    seqs = _sequences()
    worker = ReferenceWorker(_model_cfg(hf_dirs[model_type]), micro_batch_tokens=64)  # several micro-batches
    worker.load_hf()
    ours = [lp for lp, _ in worker.compute_logprobs(seqs)]
    ref = _hf_logprobs(hf_dirs[model_type], seqs)
    assert [len(lp) for lp in ours] == [s.response_len for s in seqs]
    # The log-probs vary far more than the tolerance, so agreeing within it is not trivial.
    assert torch.cat(ref).std().item() > 10 * TOLERANCE
    diff = torch.cat([a - b for a, b in zip(ours, ref)]).abs()
    record_figure(mean_abs_logprob_diff=diff.mean().item(), max_abs_logprob_diff=diff.max().item(),
                  logprob_std=torch.cat(ref).std().item(), tokens=diff.numel())
    assert diff.mean().item() <= TOLERANCE, (diff.mean().item(), diff.max().item())


def test_bf16_train_step_keeps_fp32_main_params_and_moves_weights_toward_advantage(
        world: None, hf_dirs: dict[str, Path]) -> None:
    from megatron_pc.training.worker import PolicyWorker

    seqs = _sequences()
    worker = PolicyWorker(_model_cfg(hf_dirs["qwen2"]), tiny_training(lr=LR, micro_batch_tokens=64, dual_clip=None))
    worker.load_hf()
    # Mixed precision: the optimizer updates fp32 copies and writes them back into bf16 weights.
    assert {p.dtype for g in worker.optimizer.param_groups for p in g["params"]} == {torch.float32}
    before = worker.compute_logprobs(seqs)
    for seq, (lp, _) in zip(seqs, before):
        seq.old_logprobs = lp.tolist()
    weights = {n: p.detach().clone() for n, p in worker.module.named_parameters()}

    metrics = worker.train_step(seqs)

    assert metrics["update_ok"] == 1.0
    assert torch.isfinite(torch.tensor(metrics["loss"])) and 0.0 < metrics["grad_norm"] < float("inf")
    # Every weight matrix moves. Norm weights sit near 1, where a bf16 step (2^-7) exceeds one
    # Adam step (~LR): their change stays in the fp32 main copy until it adds up.
    matrices = {n for n, p in worker.module.named_parameters() if p.dim() == 2}
    unchanged = {n for n, p in worker.module.named_parameters() if torch.equal(p, weights[n])}
    assert matrices and not matrices & unchanged, sorted(matrices & unchanged)
    after = worker.compute_logprobs(seqs)
    # Summed over the batch, the update raises log-probs of positive-advantage responses and
    # lowers those of negative ones (per sequence, bf16 noise could flip a small change).
    gain = sum(s.advantage * (a[0] - b[0]).sum().item() for s, a, b in zip(seqs, after, before))
    assert gain > 0, gain


@pytest.mark.parametrize("model_type,tie", [("llama", True), ("qwen2", False), ("qwen3", False)],
                         ids=["llama-tied", "qwen2", "qwen3"])
def test_export_to_hf_names_and_back_is_bit_exact(world: None, tmp_path: Path, model_type: str, tie: bool,
                                                  record_figure: Callable[..., None]) -> None:
    from safetensors.torch import load_file, save_file

    from megatron_pc.models.export import iter_hf_tensors
    from megatron_pc.training.worker import ReferenceWorker

    # The checkpoint in the parameters' dtype (bf16 on a GPU), so loading it rounds nothing.
    dtype = platform.default_dtype()
    original = make_hf_model(tmp_path, model_type, tie=tie, dtype=dtype, initializer_range=INIT_RANGE)
    expected = load_file(str(original / "model.safetensors"))
    worker = ReferenceWorker(_model_cfg(original))
    worker.load_hf()
    exported = {name: t.cpu().clone() for name, t in iter_hf_tensors(worker.model, worker.arch)}
    # The HF names and bits the weight sync would send: fused QKV / fc1 split again, the vocab
    # padding dropped, the tied head sent once as the embedding.
    assert sorted(exported) == sorted(expected)
    # Megatron's local spec builds its RMSNorm weights in fp32 whatever params_dtype says, so
    # those come out wider than the checkpoint: exact only if they hold its values unrounded.
    widened = sorted(n for n, t in expected.items() if exported[n].dtype != t.dtype)
    assert all(torch.equal(exported[n], exported[n].to(expected[n].dtype).to(exported[n].dtype)) for n in widened)
    changed = [n for n, t in expected.items() if _bits(exported[n].to(t.dtype)) != _bits(t)]
    assert not changed, changed
    # And back: the export saved as an HF checkpoint loads into a fresh model bit for bit.
    back = tmp_path / "back"
    back.mkdir()
    shutil.copy(original / "config.json", back / "config.json")
    save_file(exported, str(back / "model.safetensors"))
    again = ReferenceWorker(_model_cfg(back))
    again.load_hf()
    first, second = dict(worker.module.named_parameters()), dict(again.module.named_parameters())
    assert sorted(first) == sorted(second)
    assert {p.dtype for p in second.values() if p.dim() == 2} == {dtype}
    changed = [n for n, p in first.items() if _bits(p) != _bits(second[n])]
    assert not changed, changed
    record_figure(hf_tensors=len(expected), megatron_params=len(first), dtype=str(dtype).removeprefix("torch."),
                  exported_wider=len(widened), bytes=sum(t.numel() * t.element_size() for t in expected.values()))


def test_bf16_prompt_features_match_transformers_last_hidden_state(world: None, hf_dirs: dict[str, Path],
                                                                    record_figure: Callable[..., None]) -> None:
    """The screen's features (megatron_pc.training.prompt_features) under the GPU's spec (TE's final
    norm when installed) and bf16: transformers' hidden_states[-1] at each prompt's last token."""
    import transformers

    from megatron_pc.training.worker import ReferenceWorker

    prompts = [s.tokens[: s.prompt_len] for s in _sequences()]
    worker = ReferenceWorker(_model_cfg(hf_dirs["qwen2"]), micro_batch_tokens=32)  # several batches, padded
    worker.load_hf()
    part = worker.prompt_features(prompts)
    ours = torch.from_numpy(part.values[np.argsort(part.index)])
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dirs["qwen2"], dtype=torch.bfloat16,
                                                              attn_implementation="eager").to(platform.device())
    with torch.no_grad():
        ref = torch.stack([model(torch.tensor([p], device=platform.device()), output_hidden_states=True)
                           .hidden_states[-1][0, -1].float().cpu() for p in prompts])  # fmt: skip
    assert ours.dtype == torch.float32 and ours.shape == ref.shape
    cosine = torch.nn.functional.cosine_similarity(ours, ref, dim=-1)
    record_figure(min_cosine=cosine.min().item(), max_abs_diff=(ours - ref).abs().max().item())
    # bf16 rounding leaves the vectors nearly parallel; a wrong row or a missing norm does not.
    assert cosine.min().item() >= 0.99, cosine.tolist()
