"""Prompt tokenization: optional chat template, then left truncation."""

from __future__ import annotations

from typing import TYPE_CHECKING

from megatron_pc.data.records import PromptRecord

if TYPE_CHECKING:  # transformers is heavy; only its type is needed here
    from transformers import PreTrainedTokenizerBase

__all__ = ["encode_prompt"]


def encode_prompt(
    record: PromptRecord, tokenizer: "PreTrainedTokenizerBase", max_prompt_tokens: int, chat_template: bool
) -> list[int]:
    """Token ids of a prompt, at most ``max_prompt_tokens``, truncated from the LEFT.

    Left truncation keeps the end of the prompt: the question itself and the template's
    generation prompt, which the response must directly follow. With ``chat_template`` the
    prompt (a string becomes one user message) is rendered with the tokenizer's template and
    ``add_generation_prompt``; the rendered text already holds any BOS, so no special tokens are
    added. Without it, a plain string is encoded with the tokenizer's own special tokens; chat
    messages are an error (they have no plain-text form).
    """
    if max_prompt_tokens < 1:
        raise ValueError(f"max_prompt_tokens must be >= 1, got {max_prompt_tokens}")
    if chat_template:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("data.chat_template is true but the tokenizer has no chat template")
        if isinstance(record.prompt, str):
            messages = [{"role": "user", "content": record.prompt}]
        else:
            messages = [{"role": m.role, "content": m.content} for m in record.prompt]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    else:
        if not isinstance(record.prompt, str):
            raise ValueError(f"prompt {record.id!r} is a chat; set data.chat_template to true")
        ids = tokenizer(record.prompt, add_special_tokens=True)["input_ids"]
    return list(ids[-max_prompt_tokens:])
