"""Settings of the reward: which answer checker, its process pool, the overlong penalty."""

from __future__ import annotations

from dataclasses import dataclass

from megatron_pc.errors import ConfigError
from megatron_pc.reward.functions import REWARD_FUNCTIONS


@dataclass
class RewardConfig:
    """Answer checking in worker processes, plus DAPO's optional overlong penalty."""

    function: str = "exact_int"
    """Reward function by exact name: ``math_verify`` (equivalence via math-verify) or
    ``exact_int`` (integer equality; the builtin arithmetic task)."""
    workers: int = 2
    """Grading worker processes."""
    timeout_s: float = 5.0
    """A response whose grading takes longer gets reward 0; its worker is killed and replaced."""
    max_response_chars: int = 200_000
    """Longer responses get reward 0 without being sent to a worker."""
    worker_memory_mb: int = 2048
    """Address-space limit of each worker, so a runaway expression fails with MemoryError
    instead of swapping the machine. 0: no limit."""
    overlong_buffer: int = 0
    """DAPO overlong penalty: the last this-many tokens before ``rollout.max_tokens`` are
    penalised linearly (0: off)."""
    overlong_penalty: float = 1.0
    """Penalty at (and beyond) ``rollout.max_tokens``; it falls linearly to 0 at the start of
    the buffer."""

    def __post_init__(self) -> None:
        if self.function not in REWARD_FUNCTIONS:
            raise ConfigError("function", f"must be one of {sorted(REWARD_FUNCTIONS)}, got {self.function!r}")
        for name in ("workers", "max_response_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if not self.timeout_s > 0:
            raise ConfigError("timeout_s", f"must be > 0, got {self.timeout_s}")
        for name in ("worker_memory_mb", "overlong_buffer", "overlong_penalty"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")

    def check_max_tokens(self, max_tokens: int, field_prefix: str = "") -> None:
        """Cross-check against the rollout length: the buffer must fit inside ``max_tokens``."""
        if self.overlong_buffer >= max_tokens:
            err = ConfigError(
                "overlong_buffer", f"must be < rollout.max_tokens ({max_tokens}), got {self.overlong_buffer}"
            )
            raise err.within(field_prefix)
