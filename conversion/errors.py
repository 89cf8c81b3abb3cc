"""Errors of the checkpoint converters."""

from __future__ import annotations

from megatron_pc.errors import MegatronPCError


class ConversionError(MegatronPCError, ValueError):
    """A conversion cannot proceed; the message names the file and, where there is one, the tensor."""
