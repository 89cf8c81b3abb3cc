"""Prompts longer than data.max_prompt_tokens: one warning per file with count and share, an error
past data.max_truncated_share, and with prompt_truncation error at the first."""

from __future__ import annotations

import pytest

from megatron_pc.config import load_config
from megatron_pc.data.truncation import check_truncation
from megatron_pc.errors import ConfigError


def test_no_long_prompt_says_nothing() -> None:
    assert check_truncation("data.source (a.jsonl)", {"a": 3, "b": 4}, 4, 0.05) is None


def test_a_few_long_prompts_warn_once_with_count_share_and_the_file() -> None:
    lengths = {f"p{i}": 10 for i in range(99)} | {"long": 30}
    warning = check_truncation("data.source (a.jsonl)", lengths, 16, 0.05)
    assert warning is not None
    assert "data.source (a.jsonl): 1 of 100 prompts (1.0%)" in warning and "'long' has 30 tokens" in warning


def test_a_share_past_the_limit_stops_naming_the_field_and_the_share() -> None:
    lengths = {"a": 30, "b": 10, "c": 10, "d": 10}
    with pytest.raises(ConfigError, match=r"1 of 4 prompts \(25.0%\).*data.max_truncated_share \(5.0%\)") as err:
        check_truncation("validation set aime", lengths, 16, 0.05)
    assert err.value.field == "data.max_prompt_tokens" and "validation set aime" in str(err.value)
    assert check_truncation("validation set aime", lengths, 16, 0.25) is not None  # at the share: accepted


def test_truncation_error_refuses_the_first_long_prompt() -> None:
    with pytest.raises(ConfigError, match="prompt_truncation is error"):
        check_truncation("a.jsonl", {"a": 17, **{f"p{i}": 1 for i in range(999)}}, 16, 0.05, truncate=False)


def test_max_truncated_share_is_a_validated_field() -> None:
    assert load_config(None).data.max_truncated_share == 0.05
    with pytest.raises(ConfigError) as err:
        load_config(None, ["data.max_truncated_share=1.5"])
    assert err.value.field == "data.max_truncated_share"
