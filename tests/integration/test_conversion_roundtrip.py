"""HF -> Megatron -> HF reproduces every tensor bit for bit, whatever TP/PP the checkpoint was
saved with; a live TP=2 x PP=2 model exports the original tensors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conversion import hf_to_megatron, megatron_to_hf
from helpers.models import make_hf_model
from megatron_helpers import model_cfg, train_cfg
from megatron_pc.training.launch import run_distributed

pytestmark = pytest.mark.integration

MODELS = [("qwen2", False), ("llama", True)]


def job_resave_and_export(original: Path, ckpt: Path, resaved: Path) -> dict[str, torch.Tensor]:
    """Load a converted checkpoint into a TP=2 x PP=2 PolicyWorker, save it as the policy
    does (model + optimizer), and export the live model (rank 0's tensors)."""
    from megatron_pc.models.export import iter_hf_tensors
    from megatron_pc.training.checkpoint import load_model_only, save_checkpoint
    from megatron_pc.training.parallel import init_parallel
    from megatron_pc.training.worker import PolicyWorker

    init_parallel(2, 2)
    worker = PolicyWorker(model_cfg(original, 2, 2), train_cfg())
    load_model_only(worker, ckpt)
    save_checkpoint(worker, resaved)
    return {name: tensor.clone() for name, tensor in iter_hf_tensors(worker.model, worker.arch)}


def _read_dir(path: Path) -> dict[str, torch.Tensor]:
    index = path / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.is_file() else ["model.safetensors"]
    return {k: v for f in files for k, v in load_file(str(path / f)).items()}


@pytest.fixture(scope="module", params=MODELS, ids=[f"{m}{'-tied' if t else ''}" for m, t in MODELS])
def round_trip(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("round_trip")
    model_type, tie = request.param
    original = make_hf_model(root, model_type, tie=tie, layers=4)
    tp1 = hf_to_megatron.convert(original, root / "tp1", tp=1)
    tp2pp2 = hf_to_megatron.convert(original, root / "tp2pp2", tp=2, pp=2)
    live = run_distributed(job_resave_and_export, 4, original, tp2pp2, root / "resaved", timeout_s=300)
    exports = {name: megatron_to_hf.convert(ckpt, root / f"hf-from-{name}", max_shard_size="300KB")
               for name, ckpt in (("tp1", tp1), ("resaved", root / "resaved"))}
    return {"original": original, "exports": exports, "live": live}


def test_hf_to_megatron_tp2_pp2_to_hf_reproduces_every_tensor_bit_for_bit(round_trip: dict) -> None:
    expected = load_file(str(round_trip["original"] / "model.safetensors"))
    back = _read_dir(round_trip["exports"]["resaved"])
    assert sorted(back) == sorted(expected)
    for name, tensor in expected.items():
        assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), name


def test_export_is_byte_identical_whatever_layout_the_checkpoint_was_saved_with(round_trip: dict) -> None:
    tp1, resaved = round_trip["exports"]["tp1"], round_trip["exports"]["resaved"]
    weight_files = sorted(p.name for p in tp1.iterdir() if "safetensors" in p.name)
    assert len(weight_files) > 2  # sharded by --max-shard-size, with an index
    assert weight_files == sorted(p.name for p in resaved.iterdir() if "safetensors" in p.name)
    for name in weight_files:
        assert (tp1 / name).read_bytes() == (resaved / name).read_bytes(), name


def test_exported_directory_has_config_and_loads_in_transformers(round_trip: dict) -> None:
    from transformers import AutoModelForCausalLM

    export = round_trip["exports"]["tp1"]
    assert (export / "config.json").is_file() and (export / "generation_config.json").is_file()
    model = AutoModelForCausalLM.from_pretrained(export, dtype=torch.float32)
    expected = load_file(str(round_trip["original"] / "model.safetensors"))
    state = model.state_dict()
    assert all(torch.equal(state[name], tensor) for name, tensor in expected.items())


def test_live_export_of_a_tp2_pp2_model_equals_the_original_hf_tensors(round_trip: dict) -> None:
    expected = load_file(str(round_trip["original"] / "model.safetensors"))
    rank0, others = round_trip["live"][0], round_trip["live"][1:]
    assert sorted(rank0) == sorted(expected)
    assert all(torch.equal(rank0[name], tensor) for name, tensor in expected.items())
    assert all(result == {} for result in others)
