"""Forward-step functions for Megatron's pipeline schedules: log-probs (forward only) and
the policy loss (forward + backward). The same schedule runs TP/PP/DP = 1 and > 1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from megatron_pc.training.batching import MicroBatch
from megatron_pc.training.config import TrainingConfig
from megatron_pc.training.logprobs import vocab_parallel_logprobs

LossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]


def _forward(data: Iterator[MicroBatch], model: torch.nn.Module) -> tuple[torch.Tensor, MicroBatch]:
    mb = next(data)
    device = next(model.parameters()).device
    # Only the first stage reads input_ids; position ids drive RoPE on every stage.
    output = model(mb.input_ids.to(device), mb.position_ids.to(device), None)
    return output, mb


def pad_to_multiple(mb: MicroBatch, multiple: int) -> MicroBatch:
    """``mb`` right-padded so its length is a multiple of ``multiple`` (sequence parallelism
    splits the sequence over the TP ranks). Padded positions have mask 0: they train nothing,
    and causal attention keeps them out of every real position."""
    length = mb.input_ids.shape[1]
    extra = -length % multiple
    if not extra:
        return mb

    def pad(t: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, extra))

    positions = torch.arange(length + extra).expand(mb.input_ids.shape[0], -1).contiguous()
    return replace(mb, input_ids=pad(mb.input_ids), position_ids=positions, targets=pad(mb.targets), mask=pad(mb.mask),
                   extras={k: pad(v) for k, v in mb.extras.items()})


def _logprob_outputs(mb: MicroBatch, vocab_size: int, chunk_tokens: int | None, logits: torch.Tensor,
                     non_loss_data: bool = False) -> dict[str, Any]:
    logprobs, entropy = vocab_parallel_logprobs(logits, mb.targets.to(logits.device), vocab_size, chunk_tokens=chunk_tokens)
    return {"index": mb.index, "logprobs": logprobs.detach().cpu(), "entropy": entropy.detach().cpu()}


def logprob_step(vocab_size: int, chunk_tokens: int | None = None) -> Callable:
    """forward_step_func whose (non-loss) output per micro-batch is its log-probs and entropy
    (computed ``chunk_tokens`` positions at a time: training.logprob_chunk_tokens)."""

    def step(data: Iterator[MicroBatch], model: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
        output, mb = _forward(data, model)
        return output, partial(_logprob_outputs, mb, vocab_size, chunk_tokens)

    return step


def _filled(value: torch.Tensor | None, fallback: torch.Tensor, mask: torch.Tensor) -> torch.Tensor | None:
    # Off-response positions hold zeros; give them the current value so no ratio blows up there.
    return None if value is None else torch.where(mask > 0, value.to(fallback.device), fallback)


def _policy_loss(mb: MicroBatch, ctx: dict[str, Any], logits: torch.Tensor) -> tuple[torch.Tensor, dict[str, Any]]:
    cfg: TrainingConfig = ctx["cfg"]
    mask = mb.mask.to(logits.device)
    logprobs, entropy = vocab_parallel_logprobs(logits, mb.targets.to(logits.device), ctx["vocab_size"],
                                                with_entropy=True, chunk_tokens=cfg.logprob_chunk_tokens)
    current = logprobs.detach()
    old = _filled(mb.extras.get("old_logprobs"), current, mask)
    loss, metrics = ctx["loss_fn"](
        logprobs, current if old is None else old, mb.advantages.to(logits.device), mask,
        clip_low=cfg.clip_low, clip_high=cfg.clip_high, dual_clip=cfg.dual_clip, loss_agg=cfg.loss_agg,
        denominator=ctx["denominator"], ref_logprobs=_filled(mb.extras.get("ref_logprobs"), current, mask),
        kl_coef=cfg.kl_coef, kl_estimator=cfg.kl_estimator, entropy=entropy, entropy_coef=cfg.entropy_coef,
        engine_logprobs=_filled(mb.extras.get("engine_logprobs"), current, mask), tis_cap=cfg.tis_cap,
    )
    # Megatron divides each micro-batch loss by the number of micro-batches and DDP averages
    # gradients over DP; the loss is already normalised by the *global* denominator, so undo both.
    scaled = loss * ctx["num_microbatches"] * ctx["dp_size"]
    report = {"loss": loss.detach().cpu(), "tokens": float(mask.sum()), **{k: float(v) for k, v in metrics.items()}}
    return scaled, report


def train_step_fn(cfg: TrainingConfig, loss_fn: LossFn, vocab_size: int, denominator: float,
                  num_microbatches: int, dp_size: int) -> Callable:
    """forward_step_func for one optimizer step's forward + backward passes."""
    ctx = {"cfg": cfg, "loss_fn": loss_fn, "vocab_size": vocab_size, "denominator": denominator,
           "num_microbatches": num_microbatches, "dp_size": dp_size}

    def step(data: Iterator[MicroBatch], model: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
        output, mb = _forward(data, model)
        return output, partial(_policy_loss, mb, ctx)

    return step
