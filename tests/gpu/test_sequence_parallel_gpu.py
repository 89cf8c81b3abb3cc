"""Our layer spec (model.layer_spec=sdpa, megatron_pc/models/layer_specs.py) on CUDA: the policy a
GPU without Transformer Engine builds. On one GPU: in bf16 its log-probs equal transformers' and
Megatron's local spec, and a train step through our RMSNorm and SDPA moves the weights. With two
GPUs or more: TP 2 with sequence parallelism (NCCL), against TP 1.

The one-GPU tests run in the pytest process on a world of one rank (NCCL). Skipped without CUDA
by tests/conftest.py; everything imported at module level imports without CUDA."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers.models import make_hf_model, random_sequences
from megatron_pc.models.config import ModelConfig
from megatron_pc.training.config import TrainingConfig
from megatron_pc.training.launch import run_distributed

pytestmark = pytest.mark.gpu

TOLERANCE = 2e-2
"""Mean |log-prob difference| between two bf16 implementations (tests/gpu/test_megatron_gpu.py)."""


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_model(tmp_path_factory.mktemp("sp_gpu"), "qwen3", initializer_range=0.05)


def _cfg(path: Path, spec: str, tp: int = 1) -> ModelConfig:
    return ModelConfig(path=str(path), tensor_parallel=tp, params_dtype="auto", layer_spec=spec)


def _mean_diff(a: list, b: list) -> float:
    return torch.cat([(x[0].float() - y[0].float()).cpu() for x, y in zip(a, b)]).abs().mean().item()


def test_our_spec_in_bf16_on_cuda_equals_megatron_local_spec_and_trains(world: None, qwen3: Path) -> None:
    from megatron_pc.training.worker import PolicyWorker, ReferenceWorker

    seqs = random_sequences(6, prompt=(4, 13), response=(4, 21))
    local = ReferenceWorker(_cfg(qwen3, "local"))
    local.load_hf()
    reference = local.compute_logprobs(seqs)
    del local
    ours = PolicyWorker(_cfg(qwen3, "sdpa"), TrainingConfig(lr=1e-3, micro_batch_tokens=64, dual_clip=None))
    assert type(ours.module.decoder.layers[0].self_attention.core_attention).__name__ == "SdpaAttention"
    assert {p.dtype for p in ours.module.parameters()} == {torch.bfloat16}
    ours.load_hf()
    before = ours.compute_logprobs(seqs)
    assert _mean_diff(before, reference) <= TOLERANCE
    for seq, (lp, _) in zip(seqs, before):
        seq.old_logprobs = lp.tolist()
    metrics = ours.train_step(seqs)
    assert metrics["update_ok"] == 1.0 and torch.isfinite(torch.tensor(metrics["grad_norm"])) and metrics["grad_norm"] > 0
    assert _mean_diff(ours.compute_logprobs(seqs), before) > 1e-3


def _job_tp(path: Path, tp: int, seqs: list) -> dict:
    from megatron_pc.training.parallel import init_parallel
    from megatron_pc.training.worker import PolicyWorker

    init_parallel(tp, 1)
    worker = PolicyWorker(_cfg(path, "sdpa", tp), TrainingConfig(lr=1e-3, micro_batch_tokens=64, dual_clip=None,
                                                                 sequence_parallel=tp > 1))
    worker.load_hf()
    before = worker.compute_logprobs(seqs)
    for seq, (lp, _) in zip(seqs, before):
        seq.old_logprobs = lp.tolist()
    metrics = worker.train_step(seqs)
    return {"before": [(lp.cpu(), e.cpu()) for lp, e in before], "grad_norm": metrics["grad_norm"]}


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="TP 2 over NCCL needs two GPUs (one rank a GPU)")
def test_tp2_sequence_parallel_on_two_gpus_equals_tp1(qwen3: Path) -> None:
    seqs = random_sequences(6, prompt=(4, 13), response=(4, 21))
    one = run_distributed(_job_tp, 1, qwen3, 1, seqs, timeout_s=600)[0]
    two = run_distributed(_job_tp, 2, qwen3, 2, seqs, timeout_s=600)
    for rank in two:
        assert _mean_diff(rank["before"], one["before"]) <= TOLERANCE
        assert rank["grad_norm"] == pytest.approx(one["grad_norm"], rel=0.05)
