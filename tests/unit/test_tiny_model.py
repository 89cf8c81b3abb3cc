"""The tiny model maker: a short warm-up yields a complete, loadable HF directory."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from megatron_pc.errors import MegatronPCError
from megatron_pc.models import tiny
from megatron_pc.models.tokenizer import build_char_tokenizer


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny") / "model"
    return tiny.make_tiny_model(out, seed=3, warmup_steps=20, batch_size=32, eval_prompts=8, eval_samples=4)


def test_tokenizer_round_trips_an_arithmetic_line_with_bos_in_front() -> None:
    tok = build_char_tokenizer()
    ids = tok("12+345=357")["input_ids"]
    assert ids[0] == tok.bos_token_id and len(ids) == 1 + len("12+345=357")
    assert tok.decode(ids, skip_special_tokens=True) == "12+345=357"
    assert tok.decode(tok("1 - 2")["input_ids"], skip_special_tokens=True) == "1 - 2"


def test_short_warm_up_saves_a_directory_transformers_loads(model_dir: Path) -> None:
    names = {p.name for p in model_dir.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "generation_config.json"} <= names
    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok("12+345=357")["input_ids"]
    assert tok.decode(ids, skip_special_tokens=True) == "12+345=357"
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    assert model.config.model_type == "qwen2" and model.config.head_dim >= 32
    assert model.config.vocab_size == len(tok) and model.dtype == torch.float32
    assert model(torch.tensor([ids])).logits.shape == (1, len(ids), len(tok))
    report = json.loads((model_dir / "warmup.json").read_text())
    assert report["steps"] == 20 and sum(report["histogram"]) == 8


def test_warm_up_lowers_the_answer_loss() -> None:
    torch.manual_seed(0)
    tok = build_char_tokenizer()
    model = tiny._new_model(len(tok), tok, layers=1, hidden=64, heads=2, kv_heads=1, head_dim=32, intermediate=128, max_positions=32)
    ids, labels = tiny._training_batch(tok, [tiny._sample_problem(random.Random(9)) for _ in range(64)])
    with torch.no_grad():
        before = float(model(input_ids=ids, labels=labels).loss)
    tiny._warm_up(model, tok, steps=30, batch_size=64, lr=1e-3, seed=0, log_every=100)
    with torch.no_grad():
        assert float(model(input_ids=ids, labels=labels).loss) < before - 0.3


def test_problems_cover_the_graded_operations_and_answers_are_right() -> None:
    rng = random.Random(0)
    problems = [tiny._sample_problem(rng) for _ in range(300)]
    assert {op for p, _ in problems for op in "+-*" if op in p[1:]} == {"+", "-", "*"}
    for prompt, answer in problems:
        assert prompt.endswith("=") and eval(prompt[:-1]) == int(answer)  # noqa: S307 - our own digits


def test_existing_directory_is_not_overwritten_without_permission(model_dir: Path) -> None:
    with pytest.raises(MegatronPCError, match="already exists"):
        tiny.make_tiny_model(model_dir, warmup_steps=1)
    assert not list(model_dir.parent.glob(".model.tmp-*"))
