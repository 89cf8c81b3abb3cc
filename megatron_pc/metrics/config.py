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
        if self.wandb_project is not None:
            import importlib.util  # find_spec, not an import: wandb takes a second to import

            if not self.wandb_project:
                raise ConfigError("wandb_project", "must name a W&B project, or be null for no W&B logging")
            if importlib.util.find_spec("wandb") is None:
                raise ConfigError("wandb_project", f"is {self.wandb_project!r} but the wandb package is not installed: "
                                  "pip install 'megatron-pc[wandb]'")  # fmt: skip
