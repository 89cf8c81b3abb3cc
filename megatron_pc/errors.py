"""Errors the user sees. Each names what is wrong: a config field, a file and row, a tensor."""

from __future__ import annotations


class MegatronPCError(Exception):
    """Base class of the errors this project raises on purpose."""


class ConfigError(MegatronPCError, ValueError):
    """A configuration value breaks a rule. ``field`` is the dotted name (``allocation.pilot.n``)."""

    def __init__(self, field: str, rule: str) -> None:
        self.field = field
        self.rule = rule
        super().__init__(f"{field}: {rule}")

    def within(self, prefix: str) -> "ConfigError":
        """The same error with its field placed under ``prefix`` (a no-op for an empty prefix)."""
        if not prefix or self.field.startswith(prefix + "."):
            return self
        return ConfigError(f"{prefix}.{self.field}", self.rule)


class ConversionError(MegatronPCError, ValueError):
    """A model's files cannot be read or converted; the message names the file and, where there
    is one, the tensor. Raised by the HF-weights check (``models/hf_check.py``) and the converters."""


class DataError(MegatronPCError, ValueError):
    """A data file is malformed; the message names the file, the row and the field."""


class RoundLimitError(MegatronPCError, RuntimeError):
    """A step could not fill its train batch within the configured number of generation rounds."""
