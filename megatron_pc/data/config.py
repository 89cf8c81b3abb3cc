"""Settings of the prompt data: where prompts come from and how they are shaped."""

from __future__ import annotations

from dataclasses import dataclass

from megatron_pc.errors import ConfigError


@dataclass
class DataConfig:
    """Training and validation prompts."""

    source: str = "builtin:arithmetic"
    """``builtin:<name>`` for a generated set (``arithmetic``, ``gsm_symbolic``), or a path to a
    .jsonl / .parquet file in our schema (id, prompt, answer[, source, difficulty])."""
    validation: str | None = None
    """Validation prompts: a file, or None to split them off ``source`` by seed."""
    train_size: int = 2048
    """Prompts generated for a builtin training set (ignored for files)."""
    validation_size: int = 256
    """Validation prompts (generated, or split off a file source)."""
    max_prompt_tokens: int = 64
    """Longer prompts are truncated from the left."""
    chat_template: bool = False
    """Wrap prompts with the tokenizer's chat template."""

    def __post_init__(self) -> None:
        if not self.source:
            raise ConfigError("source", "must name a builtin set (builtin:arithmetic) or a file")
        for name in ("train_size", "validation_size", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")
