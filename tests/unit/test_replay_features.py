"""The start-model feature sets of scripts/replay_predictor.py: the prompt log-probs equal the
model's own loss, and the hidden state is the final one at the last prompt token."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def load_script():
    spec = importlib.util.spec_from_file_location("replay_predictor", REPO / "scripts" / "replay_predictor.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    from megatron_pc.data.records import PromptRecord
    from megatron_pc.models.tiny import make_tiny_model

    path = make_tiny_model(tmp_path_factory.mktemp("m") / "tiny", seed=1, warmup_steps=2, batch_size=8, eval_prompts=2, eval_samples=1)
    records = [PromptRecord(id=f"p{i}", prompt=f"What is {3 + i} + {40 * i}?", answer=str(43 * i + 3)) for i in range(3)]
    cfg = SimpleNamespace(model=SimpleNamespace(path=str(path)), data=SimpleNamespace(max_prompt_tokens=64, chat_template=False))
    return load_script().StartModelView(records, cfg)


def test_prompt_logprobs_sum_to_the_models_own_loss(view) -> None:
    for prompt in range(3):
        logp, hidden = view.read(prompt)
        ids = torch.tensor([view.encode(view.records[prompt])])
        with torch.no_grad():
            loss = view.model(input_ids=ids, labels=ids).loss.item()  # mean NLL over tokens 1..n-1
        assert logp.size == ids.shape[1] - 1
        assert -logp.mean() == pytest.approx(loss, rel=1e-5)
        assert hidden.shape == (view.model.config.hidden_size,)
    assert not np.allclose(view.read(0)[1], view.read(1)[1])  # different prompts, different states


def test_logprob_vector_names_mean_sum_min_tail_and_length() -> None:
    logp = np.array([-1.0, -3.0, -2.0])
    out = load_script().logprob_vector(logp)
    assert out.tolist() == pytest.approx([-2.0, -0.6, -3.0, -2.0, 0.3])
    assert load_script().logprob_vector(np.zeros(0)).tolist() == [0.0] * 5
