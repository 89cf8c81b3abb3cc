"""Per-token log-probs and entropy from vocab-parallel logits, in chunks of tokens.

Each TP rank holds logits for a contiguous slice of the (padded) vocabulary. The log-sum-exp,
the target logit and the entropy's sum p x logit are assembled with all-reduces over the TP
group; the padded vocab columns are masked out so they never take probability mass.

Memory is the point of this module. Written as plain autograd ops, the step kept about seven
fp32 copies of the logits alive for the backward pass (the fp32 cast, the masked and shifted
logits, their exponent, the probabilities, the products for the entropy, and the gradients of
those), 3.7 GB each for 6,144 tokens of a 151,936-word vocabulary. :class:`ChunkedLogprobs`
is one autograd node instead: its forward walks the tokens ``chunk_tokens`` rows at a time
and keeps only the logits it was given plus two fp32 numbers per token (log Z and the
entropy); its backward recomputes each chunk's softmax and writes that chunk's gradient into
one gradient tensor of the logits' own shape and dtype. At most three fp32 temporaries of one
chunk (``chunk_tokens`` x local vocabulary) exist at any moment.

Gradients, with p the softmax, s the logits and H the entropy of one row:
d log p(target) / d s_j = 1[j = target] - p_j and dH / d s_j = -p_j (log p_j + H).
Each rank's logits are its own leaves of the global sums, so no communication is needed in
the backward pass (as in Megatron's vocab-parallel cross entropy).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

FP32_CHUNK_TEMPORARIES = 3
"""fp32 tensors of one chunk's shape alive at once in :class:`ChunkedLogprobs` (the planner
counts them: megatron_pc.launch.plan)."""


def _tp_group() -> tuple[int, int, Any]:
    """(rank, size, group) of this process's tensor-parallel group; (0, 1, None) when neither
    torch.distributed nor Megatron's groups are set up (a single-process use, a unit test)."""
    if not dist.is_available() or not dist.is_initialized():
        return 0, 1, None
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        return 0, 1, None
    return (parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size(),
            parallel_state.get_tensor_model_parallel_group())


def _all_reduce(tensor: torch.Tensor, group: Any, size: int, op: dist.ReduceOp = dist.ReduceOp.SUM) -> torch.Tensor:
    if size > 1:
        dist.all_reduce(tensor, op=op, group=group)
    return tensor


def _shifted_chunk(chunk: torch.Tensor, padding: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    """fp32 ``chunk - row_max`` with padded columns at -inf: the one full-width temporary the
    forward and backward both start from (a fresh tensor even when ``chunk`` is fp32)."""
    shifted = chunk.to(torch.float32, copy=True)
    shifted.masked_fill_(padding, float("-inf"))
    return shifted.sub_(row_max.unsqueeze(-1))


class ChunkedLogprobs(torch.autograd.Function):
    """(log p(target), entropy) per row of ``[N, V_local]`` logits, ``chunk`` rows at a time."""

    @staticmethod
    def forward(ctx: Any, logits: torch.Tensor, targets: torch.Tensor, vocab_size: int, chunk: int,
                with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor]:
        rank, size, group = _tp_group()
        rows, local_vocab = logits.shape
        start = rank * local_vocab
        padding = torch.arange(start, start + local_vocab, device=logits.device) >= vocab_size
        in_range = (targets >= start) & (targets < start + local_vocab)
        local_index = (targets - start).clamp(0, local_vocab - 1)
        row_max = torch.empty(rows, dtype=torch.float32, device=logits.device)
        # [sum exp, target logit, sum p x logit] per row, summed over TP in one all-reduce per chunk.
        sums = torch.zeros(rows, 3, dtype=torch.float32, device=logits.device)
        for lo in range(0, rows, chunk):
            hi = min(lo + chunk, rows)
            # The max only stabilises the exponent: a constant for the gradient.
            row_max[lo:hi] = logits[lo:hi].to(torch.float32, copy=True).masked_fill_(padding, float("-inf")).amax(dim=-1)
        _all_reduce(row_max, group, size, dist.ReduceOp.MAX)
        for lo in range(0, rows, chunk):
            hi = min(lo + chunk, rows)
            shifted = _shifted_chunk(logits[lo:hi], padding, row_max[lo:hi])
            target = shifted.gather(-1, local_index[lo:hi].unsqueeze(-1)).squeeze(-1)
            sums[lo:hi, 1] = torch.where(in_range[lo:hi], target, torch.zeros_like(target))
            exp = shifted.exp()
            sums[lo:hi, 0] = exp.sum(dim=-1)
            if with_entropy:
                # exp(-inf) = 0 but 0 x -inf is nan: zero the padded logits before the product.
                sums[lo:hi, 2] = (exp * shifted.masked_fill_(padding, 0.0)).sum(dim=-1)
            del shifted, exp
        _all_reduce(sums, group, size)
        log_z = sums[:, 0].log()
        logprobs = sums[:, 1] - log_z
        # H = log Z - sum_j p_j s_j (s shifted by the row max; H does not depend on the shift).
        entropy = log_z - sums[:, 2] / sums[:, 0] if with_entropy else torch.zeros_like(log_z)
        ctx.save_for_backward(logits, targets, row_max, log_z, entropy)
        ctx.vocab_size, ctx.chunk, ctx.start, ctx.with_entropy = vocab_size, chunk, start, with_entropy
        return logprobs, entropy

    @staticmethod
    def backward(ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None) -> tuple:
        logits, targets, row_max, log_z, entropy = ctx.saved_tensors
        rows, local_vocab = logits.shape
        start = ctx.start
        padding = torch.arange(start, start + local_vocab, device=logits.device) >= ctx.vocab_size
        in_range = (targets >= start) & (targets < start + local_vocab)
        local_index = (targets - start).clamp(0, local_vocab - 1)
        grad = torch.empty_like(logits)
        for lo in range(0, rows, ctx.chunk):
            hi = min(lo + ctx.chunk, rows)
            # log p = s - max - log Z; padded columns are -inf, so p = 0 there.
            log_p = _shifted_chunk(logits[lo:hi], padding, row_max[lo:hi]).sub_(log_z[lo:hi].unsqueeze(-1))
            probs = log_p.exp()
            if ctx.with_entropy and grad_entropy is not None:
                # dH/ds = -p (log p + H); padded columns: p = 0 and log p = -inf, so set 0 there.
                out = log_p.add_(entropy[lo:hi].unsqueeze(-1)).masked_fill_(padding, 0.0).mul_(probs)
                out.mul_(-grad_entropy[lo:hi].unsqueeze(-1))
            else:
                out = log_p.zero_()
            if grad_logprobs is not None:
                # d log p(target)/ds = onehot(target) - p.
                g = grad_logprobs[lo:hi]
                out.sub_(probs.mul_(g.unsqueeze(-1)))
                hit = in_range[lo:hi].nonzero().squeeze(-1)
                out[hit, local_index[lo:hi][hit]] += g[hit]
            grad[lo:hi] = out
            del log_p, probs, out
        return grad, None, None, None, None


def vocab_parallel_logprobs(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                            with_entropy: bool = True, chunk_tokens: int | None = None,
                            ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) and the entropy of the full distribution, per position.

    Args:
        logits: [..., V_local] this TP rank's slice of the padded vocabulary (any float dtype).
        targets: [...] global token ids (< vocab_size).
        vocab_size: the real vocabulary size; columns at or beyond it are padding.
        with_entropy: also return the entropy (its gradient flows when it is used).
        chunk_tokens: positions per chunk (``training.logprob_chunk_tokens``); None: one chunk.
    Returns:
        (logprobs [...], entropy [...] or None), fp32.
    """
    shape = targets.shape
    flat = logits.reshape(-1, logits.shape[-1])
    rows = flat.shape[0]
    chunk = max(1, min(chunk_tokens or rows, rows))
    logprobs, entropy = ChunkedLogprobs.apply(flat, targets.reshape(-1), vocab_size, chunk, with_entropy)
    return logprobs.view(shape), entropy.view(shape) if with_entropy else None
