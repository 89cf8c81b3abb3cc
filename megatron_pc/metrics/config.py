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
    wandb_entity: str | None = None
    """W&B entity (user or team) of the run; null: your default entity."""
    wandb_name: str | None = None
    """W&B run name; null: ``<name>-<strategy>-<seed>``, so PC, GRPO and DAPO runs of one config differ."""
    wandb_group: str | None = None
    """W&B group; null: the config's ``name``, so its strategies and seeds sit together."""
    wandb_tags: list[str] | None = None
    """W&B tags; null: the strategy and the model directory's name."""
    samples: int = 4
    """Rollouts a step written to samples.jsonl in the run directory (prompt, response, reward,
    kind, step, prompt id), and every validation's answers to validation/step_<N>_<set>.jsonl;
    also W&B tables when W&B is on. 0: none of these."""
    progress: bool = True
    """Show a progress bar with the key figures."""
    trace: bool = True
    """Write the allocation trace (trace.jsonl) in the run directory."""
    log_every: int = 1
    """Log metrics every K steps."""

    def __post_init__(self) -> None:
        if self.log_every < 1:
            raise ConfigError("log_every", f"must be >= 1, got {self.log_every}")
        if self.samples < 0:
            raise ConfigError("samples", f"must be >= 0, got {self.samples}")
        for name in ("wandb_entity", "wandb_name", "wandb_group"):
            if getattr(self, name) == "":
                raise ConfigError(name, "must not be empty; null takes the default")
        if self.wandb_project is not None:
            import importlib.util  # find_spec, not an import: wandb takes a second to import

            if not self.wandb_project:
                raise ConfigError("wandb_project", "must name a W&B project, or be null for no W&B logging")
            if importlib.util.find_spec("wandb") is None:
                raise ConfigError("wandb_project", f"is {self.wandb_project!r} but the wandb package is not installed: "
                                  "pip install 'megatron-pc[wandb]'")  # fmt: skip
