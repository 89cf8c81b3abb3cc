"""Prompts longer than ``data.max_prompt_tokens``: counted per file, warned about once, refused
past ``data.max_truncated_share``.

A prompt cut from the left loses its beginning (the problem statement's start, a system
message), so a few cut prompts are a warning and many are a configuration that does not fit its
data: the run stops, naming the file, the count and the field to raise.
"""

from __future__ import annotations

from collections.abc import Mapping

from megatron_pc.errors import ConfigError

__all__ = ["check_truncation"]


def check_truncation(where: str, lengths: Mapping[str, int], limit: int, max_share: float, truncate: bool = True) -> str | None:
    """``lengths``: each prompt's id and its length in tokens.

    A warning naming ``where`` (a file or set) when some prompts exceed ``limit`` tokens, None when
    none do. Raises :class:`ConfigError` on ``data.max_prompt_tokens`` when their share exceeds
    ``max_share``, or when any does and ``truncate`` is False (``data.prompt_truncation: error``)."""
    longer = {pid: n for pid, n in lengths.items() if n > limit}
    if not longer:
        return None
    share = len(longer) / len(lengths)
    first = next(iter(longer))
    counted = (f"{where}: {len(longer)} of {len(lengths)} prompts ({share:.1%}) are longer than data.max_prompt_tokens ({limit}; "
               f"prompt {first!r} has {longer[first]} tokens, the longest {max(longer.values())})")
    if not truncate:
        raise ConfigError("data.max_prompt_tokens", f"{counted}, and data.prompt_truncation is error; raise the limit or set it to left")
    if share > max_share:
        raise ConfigError("data.max_prompt_tokens", f"{counted}: more than data.max_truncated_share ({max_share:.1%}) would lose their "
                          "beginning; raise data.max_prompt_tokens (and rollout.max_model_len), or data.max_truncated_share to accept it")
    return f"{counted}; they keep their last {limit} tokens (truncated from the left; data.max_truncated_share {max_share:.1%} is the most accepted)"
