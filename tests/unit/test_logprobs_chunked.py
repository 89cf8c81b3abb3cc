"""Chunked log-probs and entropy (megatron_pc.training.logprobs) against plain torch at TP=1:
values and gradients equal to 1e-6 in fp32, whatever the chunk size."""

from __future__ import annotations

import pytest
import torch

from megatron_pc.training.logprobs import vocab_parallel_logprobs

VOCAB = 97  # the real vocabulary; the logits carry 104 columns, so 7 are padding


def _inputs(seed: int = 0, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    logits = (3.0 * torch.randn(2, 37, 104, generator=gen)).to(dtype)
    # Padding columns hold large values: a mask that leaked would dominate the softmax.
    logits[..., VOCAB:] = 50.0
    targets = torch.randint(0, VOCAB, (2, 37), generator=gen)
    return logits, targets


def _reference(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The unchunked computation: full fp32 log-softmax over the real vocabulary."""
    log_p = torch.log_softmax(logits[..., :VOCAB].float(), dim=-1)
    logprobs = log_p.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    return logprobs, entropy


def _weights() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    return torch.randn(2, 37, generator=gen), torch.randn(2, 37, generator=gen)


def _values_and_grad(fn, logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    leaf = logits.clone().requires_grad_(True)
    logprobs, entropy = fn(leaf, targets)
    w_lp, w_h = _weights()
    ((w_lp * logprobs).sum() + (w_h * entropy).sum()).backward()
    return logprobs.detach(), entropy.detach(), leaf.grad


@pytest.mark.parametrize("chunk", [1, 5, 16, 74, None, 10_000])
def test_chunked_logprobs_entropy_and_gradients_equal_the_unchunked_ones(chunk: int | None) -> None:
    logits, targets = _inputs()
    want_lp, want_h, want_grad = _values_and_grad(_reference, logits, targets)
    got_lp, got_h, got_grad = _values_and_grad(
        lambda x, t: vocab_parallel_logprobs(x, t, VOCAB, chunk_tokens=chunk), logits, targets)
    torch.testing.assert_close(got_lp, want_lp, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got_h, want_h, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got_grad, want_grad, atol=1e-6, rtol=1e-6)
    assert not got_grad[..., VOCAB:].any(), "padded columns must get no gradient"


def test_without_entropy_only_the_logprob_gradient_flows() -> None:
    logits, targets = _inputs(seed=1)
    leaf = logits.clone().requires_grad_(True)
    logprobs, entropy = vocab_parallel_logprobs(leaf, targets, VOCAB, with_entropy=False, chunk_tokens=8)
    assert entropy is None
    logprobs.sum().backward()
    ref = logits.clone().requires_grad_(True)
    _reference(ref, targets)[0].sum().backward()
    torch.testing.assert_close(leaf.grad, ref.grad, atol=1e-6, rtol=1e-6)


def test_bf16_logits_get_a_bf16_gradient_and_fp32_results() -> None:
    logits, targets = _inputs(seed=2, dtype=torch.bfloat16)
    leaf = logits.clone().requires_grad_(True)
    logprobs, entropy = vocab_parallel_logprobs(leaf, targets, VOCAB, chunk_tokens=9)
    (logprobs.sum() + entropy.sum()).backward()
    assert logprobs.dtype == entropy.dtype == torch.float32
    assert leaf.grad.dtype == torch.bfloat16 and leaf.grad.shape == logits.shape
    want_lp, want_h = _reference(logits, targets)
    torch.testing.assert_close(logprobs, want_lp, atol=1e-5, rtol=0)
    torch.testing.assert_close(entropy, want_h, atol=1e-5, rtol=0)


def test_forward_without_grad_keeps_no_graph() -> None:
    logits, targets = _inputs(seed=3)
    with torch.no_grad():
        logprobs, entropy = vocab_parallel_logprobs(logits.requires_grad_(True), targets, VOCAB, chunk_tokens=4)
    assert logprobs.grad_fn is None and entropy.grad_fn is None
