"""Sequences to padded micro-batches packed by a token budget.

A sequence is prompt + response token ids. Position t of a micro-batch predicts token t+1;
``mask`` marks the positions whose target is a response token, and every per-token field
(old / reference / engine log-probs) is aligned to those positions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch


@dataclass
class Sequence:
    """One prompt + response and the per-response-token data the loss needs."""

    tokens: Any  # token ids: a list, or a numpy / torch vector (rows of a StepRows)
    prompt_len: int
    advantage: float = 0.0
    old_logprobs: Any = None
    """Per response token (a list or a vector); None: use the current policy's (on-policy, ratio 1)."""
    ref_logprobs: Any = None
    engine_logprobs: Any = None

    @property
    def response_len(self) -> int:
        """Number of response tokens."""
        return len(self.tokens) - self.prompt_len


@dataclass
class MicroBatch:
    """Padded tensors for one forward pass; ``index`` are positions in the caller's list."""

    index: list[int]
    input_ids: torch.Tensor
    position_ids: torch.Tensor
    targets: torch.Tensor
    mask: torch.Tensor
    advantages: torch.Tensor
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """old_logprobs / ref_logprobs / engine_logprobs, [b, L-1], where all sequences have them."""


def pack(lengths: list[int], token_budget: int) -> list[list[int]]:
    """Group sequence indices so that rows x longest row <= budget in each group.

    Longest first, so that a micro-batch holds sequences of similar length (less padding);
    a sequence longer than the budget gets a micro-batch of its own."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    groups: list[list[int]] = []
    for i in order:
        if groups and (len(groups[-1]) + 1) * lengths[groups[-1][0]] <= token_budget:
            groups[-1].append(i)
        else:
            groups.append([i])
    return groups


def _tensor(values: Any, dtype: torch.dtype) -> torch.Tensor:
    """A tensor of a list, a tensor or a numpy vector (copied when numpy, whose arrays read
    from Ray's object store are read-only views)."""
    if isinstance(values, np.ndarray):
        return torch.from_numpy(values.astype(np.float32 if dtype == torch.float32 else np.int64))
    return torch.as_tensor(values, dtype=dtype)


def _per_token(seqs: list[Sequence], name: str, width: int) -> torch.Tensor | None:
    values = [getattr(s, name) for s in seqs]
    if any(v is None for v in values):
        return None
    out = torch.zeros(len(seqs), width)
    for row, (seq, vals) in enumerate(zip(seqs, values)):
        if len(vals) != seq.response_len:
            raise ValueError(f"{name}: {len(vals)} values for {seq.response_len} response tokens")
        out[row, seq.prompt_len - 1: len(seq.tokens) - 1] = _tensor(vals, torch.float32)
    return out


def collate(seqs: list[Sequence], index: list[int], pad_id: int = 0) -> MicroBatch:
    """Right-padded tensors for ``seqs`` (causal attention makes right padding harmless)."""
    length = max(len(s.tokens) for s in seqs)
    ids = torch.full((len(seqs), length), pad_id, dtype=torch.long)
    mask = torch.zeros(len(seqs), length - 1)
    for row, seq in enumerate(seqs):
        if seq.prompt_len < 1 or seq.response_len < 1:
            raise ValueError("a sequence needs at least one prompt and one response token")
        ids[row, : len(seq.tokens)] = _tensor(seq.tokens, torch.long)
        mask[row, seq.prompt_len - 1: len(seq.tokens) - 1] = 1.0
    extras = {n: t for n in ("old_logprobs", "ref_logprobs", "engine_logprobs")
              if (t := _per_token(seqs, n, length - 1)) is not None}
    return MicroBatch(
        index=index,
        input_ids=ids[:, :-1].contiguous(),
        position_ids=torch.arange(length - 1).expand(len(seqs), -1).contiguous(),
        targets=ids[:, 1:].contiguous(),
        mask=mask,
        advantages=torch.tensor([s.advantage for s in seqs], dtype=torch.float32),
        extras=extras,
    )


def micro_batches(seqs: list[Sequence], token_budget: int) -> list[MicroBatch]:
    """``seqs`` packed into micro-batches of at most ``token_budget`` tokens (padded)."""
    groups = pack([len(s.tokens) - 1 for s in seqs], token_budget)
    return [collate([seqs[i] for i in g], g) for g in groups]
