"""Per-token log-probs and entropy from vocab-parallel logits, without gathering the vocab.

Each TP rank holds logits for a contiguous slice of the (padded) vocabulary. The log-sum-exp
and the target logit are assembled with all-reduces over the TP group; the padded vocab rows
are masked out so they never take probability mass.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def _tp_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum over TP ranks; the backward is the identity (each rank's local term depends only
    on its own logits, so d(sum)/d(local) = 1)."""
    from megatron.core.tensor_parallel.mappings import reduce_from_tensor_model_parallel_region

    return reduce_from_tensor_model_parallel_region(tensor)


def vocab_parallel_logprobs(logits: torch.Tensor, targets: torch.Tensor, vocab_size: int,
                            with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """log p(target) and the entropy of the full distribution, per position.

    Args:
        logits: [..., V_local] this TP rank's slice of the padded vocabulary.
        targets: [...] global token ids (< vocab_size).
        vocab_size: the real vocabulary size; columns at or beyond it are padding.
    Returns:
        (logprobs [...], entropy [...] or None), fp32.
    """
    from megatron.core import parallel_state

    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    local_vocab = logits.shape[-1]
    start = tp_rank * local_vocab
    logits = logits.float()
    column = torch.arange(start, start + local_vocab, device=logits.device)
    padding = column >= vocab_size
    logits = logits.masked_fill(padding, float("-inf"))

    # The max only stabilises the exponent; it is a constant for autograd.
    row_max = logits.detach().amax(dim=-1)
    if parallel_state.get_tensor_model_parallel_world_size() > 1:
        dist.all_reduce(row_max, op=dist.ReduceOp.MAX, group=parallel_state.get_tensor_model_parallel_group())
    shifted = logits - row_max.unsqueeze(-1)
    sum_exp = _tp_sum(shifted.exp().sum(dim=-1))
    log_z = sum_exp.log()

    in_range = (targets >= start) & (targets < start + local_vocab)
    local_index = (targets - start).clamp(0, local_vocab - 1)
    target_logit = shifted.gather(-1, local_index.unsqueeze(-1)).squeeze(-1)
    target_logit = _tp_sum(torch.where(in_range, target_logit, torch.zeros_like(target_logit)))
    logprobs = target_logit - log_z

    entropy = None
    if with_entropy:
        probs = (shifted - log_z.unsqueeze(-1)).exp()
        # -inf * 0 is nan: padded columns contribute nothing, so zero them first.
        p_times_logit = _tp_sum((probs * shifted.masked_fill(padding, 0.0)).sum(dim=-1))
        entropy = log_z - p_times_logit
    return logprobs, entropy
