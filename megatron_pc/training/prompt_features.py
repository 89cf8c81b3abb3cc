"""Prompt features: the policy's final hidden state at each prompt's last token.

A prefill-only forward (no sampling, no gradient) of the prompts alone, through the same
pipeline schedule as the log-probs, that stops before the output layer: the decoder's output
(after the final norm) at the last real token of each prompt, in fp32. A screen predicts a
prompt's success rate from it before the prompt is piloted (issue #28).

Where the parallel dimensions go:

- DP: the prompts, sorted by length, are dealt round-robin over the DP groups (about equal
  tokens each); a group with none runs no forward.
- TP: the decoder's output is whole on every TP rank (the row-parallel layers all-reduce);
  with sequence parallelism each rank holds a slice of the positions, so the rows are padded
  to a multiple of TP and the slices all-gathered over TP before the last token is taken.
- PP: only the last stage has the final norm's output. Its TP rank 0 returns the group's
  features; every other rank returns None, and :func:`assemble_features` puts the groups'
  parts back in the caller's order. No collective moves the features between ranks.
- CP: the project runs no context parallelism (megatron_pc.training.parallel makes CP = 1);
  :func:`check_supported` refuses a world that has it rather than return a wrong slice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

from megatron_pc.training.batching import pack

PromptTokens = Sequence[int] | np.ndarray
"""One prompt's token ids: a list or an integer vector."""


@dataclass
class PromptBatch:
    """Right-padded prompts for one forward; ``last`` is each row's last real position."""

    index: list[int]
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    last: torch.Tensor

    @property
    def tokens(self) -> int:
        """Real prompt tokens in the batch (padding excluded)."""
        return int(self.last.sum()) + len(self.index)


@dataclass
class PromptFeatures:
    """One DP group's features: rows of ``values`` belong to prompts ``index`` (positions in
    the caller's list); ``tokens`` the real prompt tokens it forwarded, ``padded`` with padding."""

    index: np.ndarray
    values: np.ndarray
    tokens: int
    padded: int


def check_supported() -> None:
    """A ValueError when this process's world has context parallelism (not run by the project):
    each rank would hold only a slice of every prompt's positions."""
    from megatron.core import parallel_state as ps

    if ps.get_context_parallel_world_size() > 1:
        raise ValueError(f"prompt features: context parallelism ({ps.get_context_parallel_world_size()}) is not "
                         "supported; the last token's hidden state would be on one CP rank only")  # fmt: skip


def dp_share(lengths: Sequence[int], dp_rank: int, dp_size: int) -> list[int]:
    """Positions of the prompts DP group ``dp_rank`` forwards: longest first, dealt round-robin,
    so every group gets about the same tokens (ties broken by position: deterministic)."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    return order[dp_rank::dp_size]


def prompt_batches(prompts: Sequence[PromptTokens], token_budget: int, multiple: int = 1, pad_id: int = 0) -> list[PromptBatch]:
    """``prompts`` packed into right-padded batches of at most ``token_budget`` tokens (as the
    log-probs pack sequences), each length a multiple of ``multiple`` (sequence parallelism
    splits positions over TP). Causal attention keeps padding out of every real position."""
    lengths = [len(p) for p in prompts]
    if any(n < 1 for n in lengths):
        raise ValueError(f"prompt features: prompt {lengths.index(0)} has no tokens")
    batches = []
    for group in pack(lengths, token_budget):
        width = max(lengths[i] for i in group)
        width += -width % multiple
        ids = torch.full((len(group), width), pad_id, dtype=torch.long)
        for row, i in enumerate(group):
            ids[row, : lengths[i]] = torch.from_numpy(np.array(prompts[i], dtype=np.int64))  # a copy: Ray hands read-only arrays
        last = torch.tensor([lengths[i] - 1 for i in group], dtype=torch.long)
        positions = torch.arange(width).expand(len(group), -1).contiguous()
        batches.append(PromptBatch(group, ids, positions, last))
    return batches


@contextmanager
def hidden_states_out(module: torch.nn.Module) -> Iterator[None]:
    """While inside, the GPTModel's forward returns the decoder's output (after the final norm,
    ``[s, b, h]``) instead of logits: GPTModel skips its output layer when ``post_process`` is
    off, and the final norm belongs to the decoder, built once with the last stage. Spares the
    vocabulary-wide logits that a prefill for features has no use for."""
    saved = module.post_process
    module.post_process = False
    try:
        yield
    finally:
        module.post_process = saved


def _last_token_rows(batch: PromptBatch, sequence_parallel: bool, hidden: torch.Tensor, non_loss_data: bool = False) -> dict[str, Any]:
    if sequence_parallel:
        from megatron.core.tensor_parallel import gather_from_sequence_parallel_region

        hidden = gather_from_sequence_parallel_region(hidden, tensor_parallel_output_grad=False)
    rows = torch.arange(len(batch.index), device=hidden.device)
    picked = hidden[batch.last.to(hidden.device), rows]  # [s, b, h] at (last[b], b)
    return {"index": batch.index, "features": picked.detach().to(torch.float32).cpu()}


def feature_step(sequence_parallel: bool) -> Callable:
    """forward_step_func whose (non-loss) output per batch is each prompt's last-token hidden
    state; the model must be inside :func:`hidden_states_out`."""

    def step(data: Iterator[PromptBatch], model: torch.nn.Module) -> tuple[torch.Tensor, Callable]:
        batch = next(data)
        device = next(model.parameters()).device
        output = model(batch.input_ids.to(device), batch.position_ids.to(device), None)
        return output, partial(_last_token_rows, batch, sequence_parallel)

    return step


def assemble_features(parts: Iterable[PromptFeatures | None], count: int) -> tuple[np.ndarray, dict[str, int]]:
    """The DP groups' parts (Nones, from ranks that hold none, are skipped) as one
    ``[count, hidden]`` fp32 array in the caller's order, and the tokens forwarded
    (``tokens``: real prompt tokens; ``padded_tokens``: with padding). A ValueError when a
    prompt is missing or given twice."""
    found = [p for p in parts if p is not None]
    if not found:
        raise ValueError("prompt features: no rank returned any (is the pipeline's last stage among the ranks?)")
    hidden = found[0].values.shape[1]
    out = np.zeros((count, hidden), dtype=np.float32)
    seen = np.zeros(count, dtype=np.int64)
    for part in found:
        out[part.index] = part.values
        np.add.at(seen, part.index, 1)
    if (seen != 1).any():
        bad = np.flatnonzero(seen != 1)[:5].tolist()
        raise ValueError(f"prompt features: prompts {bad} came back {seen[bad].tolist()} times, not once")
    return out, {"tokens": sum(p.tokens for p in found), "padded_tokens": sum(p.padded for p in found)}
