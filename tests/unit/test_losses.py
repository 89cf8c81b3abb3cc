"""Policy loss against hand-computed values, plus gradient behaviour of the clips."""

from __future__ import annotations

import math

import pytest
import torch

from megatron_pc.algo.losses import aggregate, kl_penalty, loss_denominator, policy_loss

torch.set_num_threads(1)
CLIP = dict(clip_low=0.2, clip_high=0.28, dual_clip=None, loss_agg="token-mean")


def _logprobs_with_ratios(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(logprobs, old_logprobs) whose per-token ratio exp(logp - old) equals ``ratios``."""
    r = torch.tensor(ratios, dtype=torch.float64)
    old = torch.full_like(r, math.log(0.25))
    return (old + r.log()).requires_grad_(True), old


def test_clip_higher_uses_separate_low_and_high_bounds() -> None:
    logp, old = _logprobs_with_ratios([[0.5, 1.0, 1.5]])
    mask = torch.ones_like(old)
    # A=+1: max(-r, -clip(r, .8, 1.28)) = -0.5, -1.0, -1.28
    loss, m = policy_loss(logp, old, torch.tensor([1.0]), mask, **CLIP)
    assert loss.item() == pytest.approx((-0.5 - 1.0 - 1.28) / 3)
    assert m["clip_frac_high"] == pytest.approx(1 / 3) and m["clip_frac_low"] == 0.0
    # A=-1: max(r, clip(r)) = 0.8, 1.0, 1.5
    loss, m = policy_loss(logp, old, torch.tensor([-1.0]), mask, **CLIP)
    assert loss.item() == pytest.approx((0.8 + 1.0 + 1.5) / 3)
    assert m["clip_frac_low"] == pytest.approx(1 / 3) and m["clip_frac_high"] == 0.0
    assert m["ratio_mean"] == pytest.approx(1.0)


def test_positive_advantage_gradient_descent_increases_logprob() -> None:
    logp, old = _logprobs_with_ratios([[1.0, 1.0]])
    for sign in (1.0, -1.0):
        logp.grad = None
        loss, _ = policy_loss(logp, old, torch.tensor([sign]), torch.ones_like(old), **CLIP)
        loss.backward()
        stepped = logp.detach() - 0.1 * logp.grad
        moved_up = bool((stepped > logp.detach()).all())
        assert moved_up == (sign > 0)


def test_clipping_zeroes_gradient_only_where_the_clip_binds() -> None:
    logp, old = _logprobs_with_ratios([[0.5, 1.5], [0.5, 1.5]])
    loss, _ = policy_loss(logp, old, torch.tensor([1.0, -1.0]), torch.ones_like(old), **CLIP)
    loss.backward()
    g = logp.grad
    # A>0: ratio 1.5 is above 1.28 (no gradient), ratio 0.5 still pushes up.
    assert g[0, 1] == 0.0 and g[0, 0] < 0
    # A<0: ratio 0.5 is below 0.8 (no gradient), ratio 1.5 still pushes down.
    assert g[1, 0] == 0.0 and g[1, 1] > 0


def test_dual_clip_caps_loss_for_negative_advantage() -> None:
    logp, old = _logprobs_with_ratios([[0.5, 3.0]])
    mask = torch.ones_like(old)
    args = dict(CLIP, dual_clip=2.5)
    # A=-2: token 0 max(1.0, 1.6) = 1.6; token 1 max(6, 2.56) = 6 capped at c*|A| = 5.
    loss, m = policy_loss(logp, old, torch.tensor([-2.0]), mask, **args)
    assert loss.item() == pytest.approx((1.6 + 5.0) / 2)
    assert m["dual_clip_frac"] == pytest.approx(0.5)
    loss.backward()
    assert logp.grad[0, 1] == 0.0
    no_dual, _ = policy_loss(logp, old, torch.tensor([-2.0]), mask, **CLIP)
    assert no_dual.item() == pytest.approx((1.6 + 6.0) / 2)
    # Positive advantages are never dual-clipped.
    pos, _ = policy_loss(logp, old, torch.tensor([2.0]), mask, **args)
    assert pos.item() == pytest.approx((-1.0 - 2.56) / 2)


@pytest.mark.parametrize(
    ("agg", "expected"),
    # seq 0: one token of -1; seq 1: three tokens of -2 (ratio 1, pg = -A).
    [("token-mean", -7 / 4), ("seq-mean-token-sum", -7 / 2), ("seq-mean-token-mean", -3 / 2)],
)
def test_each_aggregation_matches_its_formula(agg: str, expected: float) -> None:
    logp, old = _logprobs_with_ratios([[1.0, 1.0, 1.0], [1.0, 1.0, 1.0]])
    mask = torch.tensor([[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    loss, _ = policy_loss(logp, old, torch.tensor([1.0, 2.0]), mask, **dict(CLIP, loss_agg=agg))
    assert loss.item() == pytest.approx(expected)


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean"])
def test_micro_batch_halves_with_global_denominator_sum_to_full_batch(agg: str) -> None:
    gen = torch.Generator().manual_seed(0)
    logp = (torch.randn(6, 5, generator=gen, dtype=torch.float64) * 0.3 - 1).requires_grad_(True)
    old = logp.detach() + torch.randn(6, 5, generator=gen, dtype=torch.float64) * 0.3
    adv = torch.randn(6, generator=gen, dtype=torch.float64)
    mask = (torch.rand(6, 5, generator=gen) > 0.3).double()
    mask[2] = 0.0  # a padding row must not count as a sequence
    args = dict(clip_low=0.2, clip_high=0.28, dual_clip=3.0, loss_agg=agg)
    full, _ = policy_loss(logp, old, adv, mask, **args)
    (full_grad,) = torch.autograd.grad(full, logp)
    denom = loss_denominator(mask[:3].sum(-1), agg) + loss_denominator(mask[3:].sum(-1), agg)
    halves = [policy_loss(logp[s], old[s], adv[s], mask[s], denominator=denom, **args)[0] for s in (slice(0, 3), slice(3, 6))]
    (split_grad,) = torch.autograd.grad(halves[0] + halves[1], logp)
    torch.testing.assert_close(halves[0] + halves[1], full)
    torch.testing.assert_close(split_grad, full_grad)
    assert halves[0].item() != pytest.approx(full.item())  # a half alone is not the full mean


def test_kl_estimators_match_hand_values() -> None:
    logp, ref = torch.tensor([math.log(0.5)]), torch.tensor([math.log(0.25)])
    assert kl_penalty(logp, ref, "k1").item() == pytest.approx(math.log(2))
    # k3 = exp(ref - logp) - (ref - logp) - 1 = 0.5 + log 2 - 1
    assert kl_penalty(logp, ref, "k3").item() == pytest.approx(0.5 + math.log(2) - 1)
    assert kl_penalty(ref, logp, "k3").item() == pytest.approx(2 - math.log(2) - 1)
    assert kl_penalty(logp, logp, "k3").item() == 0.0
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(logp, ref, "k2")


def test_kl_loss_adds_coef_times_mean_k3_and_pulls_toward_reference() -> None:
    logp, old = _logprobs_with_ratios([[1.0, 1.0]])
    ref = old + torch.tensor([[math.log(0.5), 0.0]], dtype=torch.float64)  # ref - logp = -log 2, 0
    loss, m = policy_loss(logp, old, torch.tensor([0.0]), torch.ones_like(old), ref_logprobs=ref, kl_coef=0.1, **CLIP)
    k3 = 0.5 + math.log(2) - 1
    assert loss.item() == pytest.approx(0.1 * k3 / 2)
    assert m["kl_loss"] == pytest.approx(k3 / 2)
    loss.backward()
    assert logp.grad[0, 0] > 0  # descending lowers logp toward the lower reference logprob
    k1_loss, _ = policy_loss(logp, old, torch.tensor([0.0]), torch.ones_like(old), ref_logprobs=ref, kl_coef=0.1, kl_estimator="k1", **CLIP)
    assert k1_loss.item() == pytest.approx(0.1 * math.log(2) / 2)


def test_entropy_bonus_is_subtracted() -> None:
    logp, old = _logprobs_with_ratios([[1.0, 1.0]])
    entropy = torch.tensor([[1.0, 2.0]], dtype=torch.float64)
    loss, m = policy_loss(logp, old, torch.tensor([0.0]), torch.ones_like(old), entropy=entropy, entropy_coef=0.5, **CLIP)
    assert loss.item() == pytest.approx(-0.5 * 1.5)
    assert m["entropy"] == pytest.approx(1.5)


def test_truncated_importance_weight_is_capped_and_detached() -> None:
    logp, old = _logprobs_with_ratios([[1.0, 1.0]])
    engine = (old - torch.tensor([[math.log(3.0), math.log(0.5)]], dtype=torch.float64)).requires_grad_(True)
    # weights min(3, 2) = 2 and 0.5; A=1 so pg = -1 per token.
    loss, m = policy_loss(logp, old, torch.tensor([1.0]), torch.ones_like(old), engine_logprobs=engine, tis_cap=2.0, **CLIP)
    assert loss.item() == pytest.approx((-2.0 - 0.5) / 2)
    assert m["tis_mean"] == pytest.approx(1.25)
    loss.backward()
    assert engine.grad is None
    torch.testing.assert_close(logp.grad, torch.tensor([[-1.0, -0.25]], dtype=torch.float64))


def test_approx_kl_metric_is_k3_between_old_and_new() -> None:
    logp, old = _logprobs_with_ratios([[2.0]])
    _, m = policy_loss(logp, old, torch.tensor([1.0]), torch.ones_like(old), **CLIP)
    assert m["approx_kl"] == pytest.approx(0.5 + math.log(2) - 1)


def test_empty_mask_gives_zero_loss_that_still_backpropagates() -> None:
    logp, old = _logprobs_with_ratios([[1.5, 0.5]])
    loss, _ = policy_loss(logp, old, torch.tensor([1.0]), torch.zeros_like(old), **CLIP)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(logp.grad, torch.zeros_like(old))


def test_bad_arguments_are_rejected_with_the_name() -> None:
    logp, old = _logprobs_with_ratios([[1.0]])
    mask = torch.ones_like(old)
    with pytest.raises(ValueError, match="loss_agg"):
        policy_loss(logp, old, torch.tensor([1.0]), mask, **dict(CLIP, loss_agg="mean"))
    with pytest.raises(ValueError, match="advantages"):
        policy_loss(logp, old, torch.tensor([1.0, 2.0]), mask, **CLIP)
    with pytest.raises(ValueError, match="ref_logprobs"):
        policy_loss(logp, old, torch.tensor([1.0]), mask, kl_coef=0.1, **CLIP)
    with pytest.raises(ValueError, match="engine_logprobs"):
        policy_loss(logp, old, torch.tensor([1.0]), mask, tis_cap=2.0, **CLIP)
    with pytest.raises(ValueError, match="dual_clip"):
        policy_loss(logp, old, torch.tensor([1.0]), mask, **dict(CLIP, dual_clip=0.5))


def test_aggregate_with_explicit_denominator_divides_by_it() -> None:
    per_token = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    assert aggregate(per_token, mask, "token-mean", denominator=10.0).item() == pytest.approx(0.6)
    assert loss_denominator(mask.sum(-1), "token-mean") == 3.0 and loss_denominator(mask.sum(-1), "seq-mean-token-mean") == 2.0
    assert loss_denominator([2, 1, 0], "token-mean") == 3.0 and loss_denominator([2, 1, 0], "seq-mean-token-sum") == 2.0
