"""Group-relative advantages (GRPO): each rollout's reward against its group's other rollouts.

Std choice: the *population* std (``unbiased=False``, divide by n). For 0/1 rewards with success
rate p it is exactly sqrt(p(1-p)), the quantity Pilot-Commit reasons about (see PILOT_COMMIT.md),
and it does not depend on the group size n. That matters here because groups assembled by
Pilot-Commit (kept pilot rollouts + commit rollouts) need not all have the same size, and the
sample std (n-1) would scale advantages of small groups up. It is also defined for a group of one
(std 0, advantage 0) instead of NaN.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from megatron_pc.allocation.types import TrainGroup

__all__ = ["group_advantages", "rollout_advantages"]


def group_advantages(
    rewards: torch.Tensor,
    group_ids: torch.Tensor,
    std_normalize: bool = True,
    eps: float = 1e-6,
) -> torch.Tensor:
    """Advantage of each rollout: reward minus its group's mean, optionally over (group std + eps).

    ``rewards`` is ``[R]`` float, ``group_ids`` is ``[R]`` int64 (any values; rollouts with equal
    ids form a group, groups need not be contiguous or equally sized). A group whose rewards are
    all equal gets exactly zero advantages. Returns ``[R]`` in the dtype of ``rewards``.
    """
    if rewards.dim() != 1 or group_ids.shape != rewards.shape:
        raise ValueError(
            f"rewards and group_ids must be 1-D of the same length, got {tuple(rewards.shape)} "
            f"and {tuple(group_ids.shape)}"
        )
    if group_ids.dtype != torch.int64:
        raise ValueError(f"group_ids must be int64, got {group_ids.dtype}")
    if rewards.numel() == 0:
        return rewards.clone()
    _, inverse = torch.unique(group_ids, return_inverse=True)
    groups = int(inverse.max()) + 1
    # float64 so that the mean of identical rewards subtracts back to (nearly) zero.
    r = rewards.detach().to(torch.float64)
    counts = torch.zeros(groups, dtype=torch.float64).index_add_(0, inverse, torch.ones_like(r))
    mean = torch.zeros(groups, dtype=torch.float64).index_add_(0, inverse, r) / counts
    centered = r - mean[inverse]
    # Zero-variance groups are detected exactly (max == min): float rounding of the mean would
    # otherwise leave ~1e-17 residues that eps-division inflates to spurious nonzero values.
    high = torch.full((groups,), -torch.inf, dtype=torch.float64).scatter_reduce(0, inverse, r, "amax")
    low = torch.full((groups,), torch.inf, dtype=torch.float64).scatter_reduce(0, inverse, r, "amin")
    flat = (high == low)[inverse]
    if std_normalize:
        var = torch.zeros(groups, dtype=torch.float64).index_add_(0, inverse, centered**2) / counts
        centered = centered / (var.sqrt()[inverse] + eps)
    return torch.where(flat, torch.zeros_like(centered), centered).to(rewards.dtype)


def rollout_advantages(groups: Sequence["TrainGroup"], std_normalize: bool) -> list[float]:
    """The advantage of every rollout of ``groups``, in order, normalised within its group."""
    rewards = torch.tensor([r.reward for g in groups for r in g.rollouts], dtype=torch.float64)
    ids = torch.tensor([i for i, g in enumerate(groups) for _ in g.rollouts], dtype=torch.int64)
    return group_advantages(rewards, ids, std_normalize=std_normalize).tolist()
