"""Prompt data: our schema, file formats (ours, verl, public datasets), builtin generated sets,
converters, tokenization."""

from megatron_pc.data.config import DataConfig
from megatron_pc.data.convert import FORMATS, convert_file, convert_to_jsonl, read_records
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
    "convert_to_jsonl",
    "read_records",
    "FORMATS",
]
