"""Settings of the prompt data: where prompts come from and how they are shaped."""

from __future__ import annotations

from dataclasses import dataclass

from megatron_pc.data.builtin import BUILTIN_SOURCES
from megatron_pc.errors import ConfigError

BUILTIN_PREFIX = "builtin:"
_FILE_SUFFIXES = (".jsonl", ".parquet")


@dataclass
class DataConfig:
    """Training and validation prompts (schema: docs/data.md)."""

    source: str = "builtin:arithmetic"
    """``builtin:<name>`` for a generated set (``arithmetic``, ``gsm_symbolic``), or a path to a
    .jsonl / .parquet file in our schema (id, prompt, answer[, source, difficulty])."""
    validation: str | None = None
    """Validation prompts: a file, or None to split them off ``source`` by seed."""
    train_size: int = 2048
    """Prompts generated for a builtin training set (ignored for files)."""
    validation_size: int = 512
    """Validation prompts (generated, or split off a file source; ignored with ``validation``)."""
    max_prompt_tokens: int = 64
    """Longer prompts are truncated from the left."""
    chat_template: bool = False
    """Wrap prompts with the tokenizer's chat template."""

    def __post_init__(self) -> None:
        if not self.source:
            raise ConfigError("source", "must name a builtin set (builtin:arithmetic) or a file")
        if self.source.startswith(BUILTIN_PREFIX):
            name = self.source[len(BUILTIN_PREFIX):]
            if name not in BUILTIN_SOURCES:
                known = ", ".join(BUILTIN_PREFIX + n for n in sorted(BUILTIN_SOURCES))
                raise ConfigError("source", f"unknown builtin set {name!r}; known: {known}")
        else:
            _check_file("source", self.source)
        if self.validation is not None:
            _check_file("validation", self.validation)
        for name in ("train_size", "validation_size", "max_prompt_tokens"):
            if getattr(self, name) < 1:
                raise ConfigError(name, f"must be >= 1, got {getattr(self, name)}")


def _check_file(field: str, path: str) -> None:
    """Only the type is checked here: configs are validated on machines that lack the data."""
    if not path.lower().endswith(_FILE_SUFFIXES):
        raise ConfigError(field, f"must be a .jsonl or .parquet file (or builtin:<name>), got {path!r}")
