"""Policy losses: PPO ratio clip with clip-higher and dual-clip, KL to a reference, entropy bonus,
truncated importance weights against the generating engine, and the three aggregations.

All tensors are per token, ``[B, T]`` with a 0/1 ``mask`` of response tokens, except
``advantages`` which is per sequence ``[B]``. Pure functions: no process groups.

Global means across micro-batches and data-parallel ranks: the caller counts the global
denominator once per optimizer step (sum of :func:`loss_denominator` over every micro-batch on
every rank, from the rows' response lengths) and passes it as ``denominator``; each micro-batch loss is then that micro-batch's
share of the global mean, so summing the losses (gradient accumulation + DP all-reduce *sum*)
gives exactly the global-mean loss.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

__all__ = ["LOSS_AGGS", "KL_ESTIMATORS", "kl_penalty", "loss_denominator", "aggregate", "policy_loss"]

LOSS_AGGS = ("token-mean", "seq-mean-token-sum", "seq-mean-token-mean")
KL_ESTIMATORS = ("k1", "k3")
# exp() of a log-ratio beyond this overflows or dominates the loss; k3 clamps its argument.
_K3_LOG_RATIO_LIMIT = 20.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str = "k3") -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from sampled tokens.

    ``k1 = logp - ref`` (unbiased, high variance, can be negative);
    ``k3 = exp(ref - logp) - (ref - logp) - 1`` (unbiased, always >= 0, low variance). The k3
    log-ratio is clamped to +-20 so one extreme token cannot overflow the loss.
    """
    if estimator == "k1":
        return logprobs - ref_logprobs
    if estimator == "k3":
        log_ratio = (ref_logprobs - logprobs).clamp(-_K3_LOG_RATIO_LIMIT, _K3_LOG_RATIO_LIMIT)
        return torch.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"kl_estimator must be one of {KL_ESTIMATORS}, got {estimator!r}")


def loss_denominator(response_lengths: torch.Tensor | Iterable[int], loss_agg: str) -> float:
    """The loss denominator of rows with these response lengths under ``loss_agg``: the one rule
    every place that divides a loss uses (the driver's plan of an update, the worker's update,
    and :func:`aggregate` over a micro-batch's mask, whose row sums are the lengths).

    token-mean: the number of response tokens; seq-mean-*: the number of rows with at least one
    response token (empty rows are padding and do not count).
    """
    _check_agg(loss_agg)
    if isinstance(response_lengths, torch.Tensor):
        tokens, rows = float(response_lengths.sum()), float((response_lengths > 0).sum())
    else:
        lengths = list(response_lengths)
        tokens, rows = float(sum(lengths)), float(sum(1 for n in lengths if n > 0))
    return tokens if loss_agg == "token-mean" else rows


def aggregate(per_token: torch.Tensor, mask: torch.Tensor, loss_agg: str, denominator: float | None = None) -> torch.Tensor:
    """Reduce a ``[B, T]`` per-token loss to a scalar with ``loss_agg`` (see module docstring).

    ``denominator`` None means the local mean. An empty batch with a local mean gives 0 (still
    attached to the graph so that backward works on every rank).
    """
    _check_agg(loss_agg)
    mask = mask.to(per_token.dtype)
    if loss_agg == "token-mean":
        total = (per_token * mask).sum()
    else:
        token_sum = (per_token * mask).sum(dim=-1)
        if loss_agg == "seq-mean-token-mean":
            token_sum = token_sum / mask.sum(dim=-1).clamp(min=1.0)
        total = token_sum.sum()
    denom = loss_denominator(mask.sum(dim=-1), loss_agg) if denominator is None else float(denominator)
    if denom <= 0:
        return total * 0.0
    return total / denom


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
    loss_agg: str,
    denominator: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "k3",
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    engine_logprobs: torch.Tensor | None = None,
    tis_cap: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped policy-gradient loss (to minimise) and its metrics.

    Per token, with ``r = exp(logp - old)`` and sequence advantage ``A``:
    ``pg = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high))``; for ``A < 0`` and
    ``dual_clip = c`` it is further capped at ``c |A|``. With ``tis_cap``, ``pg`` is multiplied by
    the detached weight ``min(exp(old - engine), tis_cap)``. The loss is
    ``agg(pg) + kl_coef * agg(kl_penalty(logp, ref)) - entropy_coef * agg(entropy)``.
    ``engine_logprobs`` without ``tis_cap`` is ignored.
    """
    _check_inputs(logprobs, old_logprobs, advantages, mask, dual_clip, loss_agg)
    mask_f = mask.to(logprobs.dtype)
    log_ratio = logprobs - old_logprobs
    ratio = torch.exp(log_ratio)
    adv = advantages.to(logprobs.dtype).unsqueeze(-1).expand_as(logprobs)
    pg = _clipped_pg(ratio, adv, clip_low, clip_high, dual_clip)
    metrics = _clip_metrics(ratio, log_ratio, adv, mask_f, clip_low, clip_high, dual_clip)

    if tis_cap is not None:
        if engine_logprobs is None:
            raise ValueError("tis_cap is set but engine_logprobs is None")
        # Detached: the weight corrects the sampling distribution, it is not optimised.
        weight = torch.exp(old_logprobs - engine_logprobs).clamp(max=tis_cap).detach()
        pg = pg * weight
        metrics["tis_mean"] = _masked_mean(weight, mask_f)
    loss = aggregate(pg, mask_f, loss_agg, denominator)
    metrics["pg_loss"] = float(loss.detach())

    if kl_coef > 0 or ref_logprobs is not None:
        if ref_logprobs is None:
            raise ValueError("kl_coef > 0 needs ref_logprobs")
        kl = kl_penalty(logprobs, ref_logprobs, kl_estimator)
        metrics["kl_loss"] = _masked_mean(kl, mask_f)
        if kl_coef > 0:
            loss = loss + kl_coef * aggregate(kl, mask_f, loss_agg, denominator)
    if entropy_coef > 0 or entropy is not None:
        if entropy is None:
            raise ValueError("entropy_coef > 0 needs entropy")
        metrics["entropy"] = _masked_mean(entropy, mask_f)
        if entropy_coef > 0:
            loss = loss - entropy_coef * aggregate(entropy, mask_f, loss_agg, denominator)
    return loss, metrics


def _clipped_pg(
    ratio: torch.Tensor, adv: torch.Tensor, clip_low: float, clip_high: float, dual_clip: float | None
) -> torch.Tensor:
    """Per-token PPO loss with clip-higher and, for negative advantages, the dual-clip cap."""
    unclipped = -adv * ratio
    clipped = -adv * ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    # max() picks the clipped branch exactly where the clip binds, and clamp() has zero
    # gradient there: those tokens stop pushing the ratio further.
    pg = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        # For A < 0 a huge ratio makes -A*r unbounded; cap the loss at c*|A| (= -A*c).
        pg = torch.where(adv < 0, torch.minimum(pg, -adv * dual_clip), pg)
    return pg


def _clip_metrics(
    ratio: torch.Tensor,
    log_ratio: torch.Tensor,
    adv: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float,
    clip_high: float,
    dual_clip: float | None,
) -> dict[str, float]:
    """Fractions of response tokens where each clip binds (zero gradient), mean ratio, approx KL."""
    with torch.no_grad():
        low = (adv < 0) & (ratio < 1.0 - clip_low)
        high = (adv > 0) & (ratio > 1.0 + clip_high)
        dual = (adv < 0) & (ratio > dual_clip) if dual_clip is not None else torch.zeros_like(low)
        # k3 estimate of KL(old || new) over the sampled tokens: how far this update has moved.
        approx_kl = torch.exp(-log_ratio) + log_ratio - 1.0
        return {
            "clip_frac_low": _masked_mean(low.to(mask.dtype), mask),
            "clip_frac_high": _masked_mean(high.to(mask.dtype), mask),
            "dual_clip_frac": _masked_mean(dual.to(mask.dtype), mask),
            "ratio_mean": _masked_mean(ratio, mask),
            "approx_kl": _masked_mean(approx_kl, mask),
        }


def _masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean of ``values`` over the response tokens, as a float (0 for an empty mask)."""
    count = float(mask.sum())
    return float((values.detach() * mask).sum()) / count if count > 0 else 0.0


def _check_agg(loss_agg: str) -> None:
    if loss_agg not in LOSS_AGGS:
        raise ValueError(f"loss_agg must be one of {LOSS_AGGS}, got {loss_agg!r}")


def _check_inputs(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    dual_clip: float | None,
    loss_agg: str,
) -> None:
    """Fail early, naming the tensor, instead of broadcasting mismatched shapes silently."""
    _check_agg(loss_agg)
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [B, T], got {tuple(logprobs.shape)}")
    for name, t in (("old_logprobs", old_logprobs), ("mask", mask)):
        if t.shape != logprobs.shape:
            raise ValueError(f"{name} must match logprobs {tuple(logprobs.shape)}, got {tuple(t.shape)}")
    if advantages.shape != logprobs.shape[:1]:
        raise ValueError(f"advantages must be [B] = [{logprobs.shape[0]}], got {tuple(advantages.shape)}")
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 or None, got {dual_clip}")
