"""Helpers of the Megatron integration tests: configs, HF reference logits and the functions
that run inside spawned gloo processes (they must be importable, hence module level). The tiny
random models and sequences are tests/helpers/models.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from helpers.models import VOCAB
from helpers.tiny import tiny_training
from megatron_pc.models.config import ModelConfig
from megatron_pc.training.batching import Sequence
from megatron_pc.training.config import TrainingConfig

def hf_logits(path: Path, ids: torch.Tensor) -> torch.Tensor:
    """Logits of the HF reference implementation (fp32, eager attention)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32,
                                                              attn_implementation="eager")
    with torch.no_grad():
        return model(ids).logits


def model_cfg(path: Path, tp: int = 1, pp: int = 1) -> ModelConfig:
    """fp32 model config for ``path``."""
    return ModelConfig(path=str(path), tensor_parallel=tp, pipeline_parallel=pp, params_dtype="float32")


def train_cfg(**overrides: Any) -> TrainingConfig:
    """A training config for tests: small budget so micro-batches are several."""
    base = dict(lr=1e-3, grad_clip=1.0, micro_batch_tokens=24, dual_clip=None, warmup_steps=0, steps=10)
    base.update(overrides)
    return tiny_training(**base)


# ---- functions run inside spawned processes ---------------------------------------------


def _init(tp: int, pp: int) -> None:
    from megatron_pc.training.parallel import init_parallel

    logging.basicConfig(level=logging.WARNING)
    init_parallel(tp, pp, seed=1234)


def job_full_logits(path: Path, tp: int, ids: torch.Tensor) -> torch.Tensor | None:
    """Megatron logits for ``ids`` loaded from HF at TP=tp, gathered over TP (test only)."""
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from megatron_pc.training.worker import ReferenceWorker

    _init(tp, 1)
    worker = ReferenceWorker(model_cfg(path, tp))
    worker.load_hf()
    with torch.no_grad():
        positions = torch.arange(ids.shape[1]).expand_as(ids)
        logits = worker.module(ids, positions, None)
        return gather_from_tensor_model_parallel_region(logits)[..., :VOCAB].clone()


def job_logprobs(path: Path, tp: int, pp: int, seqs: list[Sequence], ckpt: Path | None = None) -> list:
    """Response log-probs on every rank, from HF weights or a Megatron checkpoint."""
    from megatron_pc.training.worker import ReferenceWorker

    _init(tp, pp)
    worker = ReferenceWorker(model_cfg(path, tp, pp), micro_batch_tokens=24)
    if ckpt is None:
        worker.load_hf()
    else:
        from megatron_pc.training.checkpoint import load_model_only

        load_model_only(worker, ckpt)
    return worker.compute_logprobs(seqs)


def job_train(path: Path, tp: int, pp: int, seqs: list[Sequence], n_steps: int, save_at: int | None = None,
              ckpt: Path | None = None, resume: Path | None = None, old: list | None = None,
              **overrides: Any) -> dict[str, Any]:
    """Train ``n_steps`` on ``seqs`` (optionally saving after step ``save_at`` or resuming);
    returns losses and the log-probs before and after. The old log-probs are ``old`` or the
    initial model's, so the PPO ratio (and the loss) moves from step to step."""
    from megatron_pc.training.checkpoint import load_checkpoint, save_checkpoint
    from megatron_pc.training.worker import PolicyWorker

    _init(tp, pp)
    worker = PolicyWorker(model_cfg(path, tp, pp), train_cfg(**overrides))
    if resume is None:
        worker.load_hf()
    else:
        load_checkpoint(worker, resume)
    before = worker.compute_logprobs(seqs)
    for seq, (lp, _) in zip(seqs, old or before):
        seq.old_logprobs = lp.tolist()
    losses = []
    for _ in range(n_steps):
        losses.append(worker.train_step(seqs)["loss"])
        if save_at is not None and worker.step == save_at:
            save_checkpoint(worker, ckpt)
    return {"losses": losses, "before": before, "after": worker.compute_logprobs(seqs), "step": worker.step}


def job_schedule(path: Path, updates_per_step: int, n_steps: int, seqs: list[Sequence], **overrides: Any) -> dict[str, Any]:
    """``n_steps`` training steps of ``updates_per_step`` updates each (old log-probs once per
    step, the schedule advanced by the last update); the lr every update used, the lr the next
    step will use, and every update's metrics."""
    from megatron_pc.training.worker import PolicyWorker

    _init(1, 1)
    worker = PolicyWorker(model_cfg(path), train_cfg(**overrides))
    worker.load_hf()
    used, metrics = [], []
    size = -(-len(seqs) // updates_per_step)
    for _ in range(n_steps):
        for seq, (lp, _) in zip(seqs, worker.compute_logprobs(seqs)):
            seq.old_logprobs = lp.tolist()
        chunks = [seqs[i : i + size] for i in range(0, len(seqs), size)]
        for i, chunk in enumerate(chunks):
            out = worker.train_step(chunk, last_update=i == len(chunks) - 1)
            used.append(out["lr"])
            metrics.append(out)
    return {"lr_used": used, "lr_next": float(worker.optimizer.param_groups[0]["lr"]), "step": worker.step, "metrics": metrics}


def job_train_shares(path: Path, tp: int, seqs: list[Sequence], n_steps: int) -> dict[str, Any]:
    """The driver's path: each DP group gets only its share of ``seqs`` (split by tokens, as
    StepRows), computes its old log-probs locally and trains on them (train_local); returns
    losses and the global log-probs before and after, as job_train does."""
    import numpy as np
    from megatron.core import parallel_state as ps

    from megatron_pc.algo.losses import loss_denominator
    from megatron_pc.training.payload import RolloutPayload, RowPlan, split_by_tokens
    from megatron_pc.training.worker import PolicyWorker

    _init(tp, 1)
    worker = PolicyWorker(model_cfg(path, tp), train_cfg())
    worker.load_hf()
    before = worker.compute_logprobs(seqs)
    plan = RowPlan([np.asarray(s.tokens[: s.prompt_len], dtype=np.int32) for s in seqs],
                   [RolloutPayload.of(s.tokens[s.prompt_len :], [0.0] * s.response_len, "stop", s.tokens[: s.prompt_len]) for s in seqs],
                   [s.advantage for s in seqs], np.zeros(len(seqs), dtype=np.int32),
                   [loss_denominator([s.response_len for s in seqs], "token-mean")], [1.0])  # fmt: skip
    shares = split_by_tokens(plan.lengths, plan.update, 1, ps.get_data_parallel_world_size())
    mine = plan.build(shares[ps.get_data_parallel_rank()]).sequences()
    for seq, (lp, _) in zip(mine, worker.local_logprobs(mine)):
        seq.old_logprobs = lp
    losses = [worker.train_local(mine, plan.denominators[0])["loss"] for _ in range(n_steps)]
    return {"losses": losses, "before": before, "after": worker.compute_logprobs(seqs), "rows": len(mine)}


def job_prompt_features(path: Path, tp: int, pp: int, prompts: list[list[int]], sequence_parallel: bool = False) -> Any:
    """Every rank's PromptFeatures (or None) for ``prompts``, from HF weights, micro-batches of
    at most 24 tokens (several, padded)."""
    from megatron_pc.training.worker import ReferenceWorker

    _init(tp, pp)
    worker = ReferenceWorker(model_cfg(path, tp, pp), micro_batch_tokens=24, sequence_parallel=sequence_parallel)
    worker.load_hf()
    return worker.prompt_features(prompts)
