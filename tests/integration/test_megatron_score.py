"""``megatron-pc score``: response log-probs from an HF directory, TP=2 agreeing with TP=1."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers.models import make_hf_model
from megatron_pc.cli import main as cli_main

pytestmark = pytest.mark.integration


def _char_tokenizer(path: Path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {c: i for i, c in enumerate("0123456789+-=* abcdefghijklmnopqrstuvwxyz?")}
    vocab["[UNK]"] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)


def test_score_cli_writes_response_logprobs_and_tp2_matches_tp1(tmp_path: Path) -> None:
    model = make_hf_model(tmp_path, "qwen3")
    _char_tokenizer(model)
    rows = [{"prompt": "12+7=", "response": "19"}, {"prompt": "what is 3*3?", "response": "9 it is"}]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    outs = []
    for tp in (1, 2):
        dst = tmp_path / f"out{tp}.jsonl"
        assert cli_main(["score", "--load", str(model), "--input", str(src), "--output", str(dst), "--tp", str(tp)]) == 0
        outs.append([json.loads(line) for line in dst.read_text().splitlines()])
    for row, one, two in zip(rows, *outs):
        assert one["prompt"] == row["prompt"] and len(one["token_ids"]) == len(row["response"])
        assert len(one["logprobs"]) == len(one["token_ids"]) and all(lp < 0 for lp in one["logprobs"])
        assert max(abs(a - b) for a, b in zip(one["logprobs"], two["logprobs"])) <= 1e-5


def test_score_cli_rejects_tp_that_does_not_divide_the_heads(tmp_path: Path) -> None:
    model = make_hf_model(tmp_path, "llama")
    src = tmp_path / "in.jsonl"
    src.write_text('{"prompt": "a", "response": "b"}\n')
    code = cli_main(["score", "--load", str(model), "--input", str(src), "--output", str(tmp_path / "o"), "--tp", "3"])
    assert code == 2
