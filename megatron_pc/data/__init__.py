"""Prompt data: our schema, file readers, builtin generated sets, converters, tokenization."""

from megatron_pc.data.config import DataConfig
from megatron_pc.data.convert import FORMATS, convert_file
from megatron_pc.data.loading import load_prompts, split_prompts
from megatron_pc.data.records import ChatMessage, PromptRecord, read_prompts, write_jsonl
from megatron_pc.data.tokenize import encode_prompt

__all__ = [
    "DataConfig",
    "PromptRecord",
    "ChatMessage",
    "read_prompts",
    "write_jsonl",
    "load_prompts",
    "split_prompts",
    "encode_prompt",
    "convert_file",
    "FORMATS",
]
