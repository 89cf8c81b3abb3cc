"""Settings of metrics output."""

from __future__ import annotations

from dataclasses import dataclass

from megatron_pc.errors import ConfigError


@dataclass
class LoggingConfig:
    """Where per-step metrics go."""

    jsonl: bool = True
    """Write metrics.jsonl in the run directory."""
    tensorboard: bool = True
    """Write TensorBoard events in the run directory."""
    wandb_project: str | None = None
    """Also log to this W&B project (needs wandb installed)."""
    progress: bool = True
    """Show a progress bar with the key figures."""
    trace: bool = True
    """Write the allocation trace (trace.jsonl) in the run directory."""
    log_every: int = 1
    """Log metrics every K steps."""

    def __post_init__(self) -> None:
        if self.log_every < 1:
            raise ConfigError("log_every", f"must be >= 1, got {self.log_every}")
