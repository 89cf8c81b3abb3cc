"""Rollout allocation: pure logic, no torch.distributed, Ray or vLLM.

Strategies are registered by exact name; :func:`build_strategy` makes one from the config.
"""

from __future__ import annotations

from megatron_pc.allocation.base import AllocationStrategy
from megatron_pc.allocation.config import AllocationConfig
from megatron_pc.allocation.dapo import DAPO
from megatron_pc.allocation.greso import GRESO
from megatron_pc.allocation.grpo import GRPO
from megatron_pc.allocation.mopps import MoPPS
from megatron_pc.allocation.pilot_commit import PilotCommit
from megatron_pc.allocation.speed_rl import SpeedRL
from megatron_pc.allocation.trace import TraceSink
from megatron_pc.allocation.types import Request, Rollout, RoundPlan, StepResult, TrainGroup

STRATEGIES: dict[str, type[AllocationStrategy]] = {cls.name: cls for cls in (PilotCommit, GRPO, DAPO, SpeedRL, GRESO, MoPPS)}
"""Pilot-Commit, the two baselines of its paper, and the field's other allocators (SPEED-RL, GRESO, MoPPS)."""


def strategy_class(name: str) -> type[AllocationStrategy]:
    """The strategy registered under exactly ``name``."""
    try:
        return STRATEGIES[name]
    except KeyError:
        raise ValueError(f"unknown allocation strategy {name!r}; known: {', '.join(sorted(STRATEGIES))}") from None


def build_strategy(
    cfg: AllocationConfig, pool_size: int, seed: int, generation_ranks: int = 1, trace: TraceSink | None = None
) -> AllocationStrategy:
    """The strategy named by ``cfg.strategy`` over a pool of ``pool_size`` prompts."""
    return strategy_class(cfg.strategy)(cfg, pool_size, seed, generation_ranks, trace)


__all__ = [
    "AllocationConfig",
    "AllocationStrategy",
    "STRATEGIES",
    "Request",
    "Rollout",
    "RoundPlan",
    "StepResult",
    "TrainGroup",
    "build_strategy",
    "strategy_class",
]
