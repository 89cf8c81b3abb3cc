"""Settings of the reward: which answer checker (built-in or your own), its process pool, the
success rule, the overlong penalty."""

from __future__ import annotations

from dataclasses import dataclass, field

from megatron_pc.errors import ConfigError
from megatron_pc.reward.custom import check_spec, is_custom, parse_spec


@dataclass
class RewardConfig:
    """Answer checking in worker processes, plus DAPO's optional overlong penalty."""

    function: str = "math_verify"
    """Reward function: a built-in grader by exact name, ``math_verify`` (equivalence via
    math-verify) or ``exact_int`` (integer equality; the builtin arithmetic task), or your own
    as ``module:function`` or ``path/to/file.py:function`` with verl's signature
    ``compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict``
    (docs/reward.md)."""
    by_source: dict[str, str] = field(default_factory=dict)
    """Reward function by the prompt's ``data_source`` (verl's column; our ``source``), in the
    same forms as ``function``, which grades every source not listed."""
    success_threshold: float = 1.0
    """A response whose score (before the overlong penalty) is at least this is a success: for
    Pilot-Commit's band, the history, the screen, ``val_accuracy`` and pass@k/maj@k. The
    advantages and DAPO's filter use the raw reward."""
    workers: int = 16
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
        for name, spec in [("function", self.function), *((f"by_source.{k}", v) for k, v in self.by_source.items())]:
            if is_custom(spec):
                try:
                    parse_spec(spec)
                except ValueError as err:
                    raise ConfigError(name, str(err)) from None
        for name in ("workers", "max_response_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
        if not self.timeout_s > 0:
            raise ConfigError("timeout_s", f"must be > 0, got {self.timeout_s}")
        for name in ("worker_memory_mb", "overlong_buffer", "overlong_penalty"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"must be >= 0, got {getattr(self, name)}")

    def function_for(self, source: str | None) -> str:
        """The reward function that grades a prompt of ``source``."""
        return self.by_source.get(source, self.function) if source is not None else self.function

    def check_functions(self, field_prefix: str = "reward") -> None:
        """Import every custom function now, before any model loads; a ConfigError names the
        field and the import's error."""
        check_spec(self.function, f"{field_prefix}.function")
        for source, spec in self.by_source.items():
            check_spec(spec, f"{field_prefix}.by_source.{source}")

    def check_max_tokens(self, max_tokens: int, field_prefix: str = "") -> None:
        """Cross-check against the rollout length: the buffer must fit inside ``max_tokens``."""
        if self.overlong_buffer >= max_tokens:
            err = ConfigError(
                "overlong_buffer", f"must be < rollout.max_tokens ({max_tokens}), got {self.overlong_buffer}"
            )
            raise err.within(field_prefix)
