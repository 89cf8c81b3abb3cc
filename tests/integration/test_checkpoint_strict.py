"""Strict resume on real Megatron over gloo: a checkpoint whose keys differ from the model's
(another architecture: a bias the model lacks, or lacks one the model has) is refused, naming
the keys; the same architecture loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers.models import make_hf_model, random_sequences
from megatron_helpers import _init, model_cfg, train_cfg
from megatron_pc.training.launch import run_distributed

pytestmark = pytest.mark.integration


def job_save_then_load(save_from: Path, load_into: Path, ckpt: Path) -> dict[str, str]:
    """Save a PolicyWorker of ``save_from`` at ``ckpt``; load it (full resume and model only)
    into workers of ``load_into``; the error text of each load, '' when it loaded."""
    from megatron_pc.training.checkpoint import CheckpointMismatchError, load_checkpoint, load_model_only, save_checkpoint
    from megatron_pc.training.worker import PolicyWorker, ReferenceWorker

    _init(1, 1)
    saved = PolicyWorker(model_cfg(save_from), train_cfg())
    saved.load_hf()
    saved.train_step(random_sequences())  # Adam's moments exist only after a step
    save_checkpoint(saved, ckpt)
    out = {}
    for name, make, load in (("resume", lambda: PolicyWorker(model_cfg(load_into), train_cfg()), load_checkpoint),
                             ("model_only", lambda: ReferenceWorker(model_cfg(load_into)), load_model_only)):
        try:
            load(make(), ckpt)
            out[name] = ""
        except CheckpointMismatchError as err:
            out[name] = str(err)
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("hf")
    # Same sizes; Qwen2 has Q/K/V biases, Llama has none.
    return {"qwen2": make_hf_model(root, "qwen2"), "llama": make_hf_model(root, "llama")}


def _run(models: dict[str, Path], tmp_path: Path, save_from: str, load_into: str) -> dict[str, str]:
    return run_distributed(job_save_then_load, 1, models[save_from], models[load_into], tmp_path / "ckpt", timeout_s=300)[0]


def test_checkpoint_lacking_a_key_the_model_has_is_refused_naming_it(models: dict[str, Path], tmp_path: Path) -> None:
    out = _run(models, tmp_path, save_from="llama", load_into="qwen2")
    for name in ("resume", "model_only"):
        assert "missing from the checkpoint (the model has them): " in out[name], out[name]
        assert "decoder.layers.self_attention.linear_qkv.bias" in out[name]


def test_checkpoint_with_a_key_the_model_lacks_is_refused_naming_it(models: dict[str, Path], tmp_path: Path) -> None:
    out = _run(models, tmp_path, save_from="qwen2", load_into="llama")
    for name in ("resume", "model_only"):
        assert "unexpected in the checkpoint (the model has no such key): " in out[name], out[name]
        assert "decoder.layers.self_attention.linear_qkv.bias" in out[name]



def test_checkpoint_of_the_same_architecture_loads(models: dict[str, Path], tmp_path: Path) -> None:
    assert _run(models, tmp_path, save_from="qwen2", load_into="qwen2") == {"resume": "", "model_only": ""}
