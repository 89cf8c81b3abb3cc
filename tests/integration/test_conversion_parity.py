"""Converted checkpoints (HF -> Megatron) give the logits of transformers on the original
model at TP=1 and TP=2, and the live export of a TP=2 model returns the original tensors."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conversion.hf_to_megatron import convert
from helpers.models import VOCAB, make_hf_model
from megatron_helpers import hf_logits, model_cfg
from megatron_pc.training.launch import run_distributed

pytestmark = pytest.mark.integration

MODELS = [("llama", True), ("qwen2", False), ("qwen3", False)]


def job_logits_and_export(ckpts: list[Path], originals: list[Path], ids: torch.Tensor) -> dict:
    """Per TP size (1, then 2 on the same processes): logits of every converted checkpoint,
    and at TP=2 the live export of each model (rank 0 only)."""
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from megatron_pc.models.export import iter_hf_tensors
    from megatron_pc.training.checkpoint import load_model_only
    from megatron_pc.training.parallel import destroy_parallel, init_parallel
    from megatron_pc.training.worker import ReferenceWorker

    out: dict = {"logits": {}, "export": {}}
    for tp in (1, 2):
        init_parallel(tp, 1)
        for ckpt, original in zip(ckpts, originals):
            worker = ReferenceWorker(model_cfg(original, tp))
            load_model_only(worker, ckpt)
            with torch.no_grad():
                logits = worker.module(ids, torch.arange(ids.shape[1]).expand_as(ids), None)
            out["logits"][(ckpt.name, tp)] = gather_from_tensor_model_parallel_region(logits)[..., :VOCAB].clone()
            if tp == 2:
                out["export"][ckpt.name] = {k: v.clone() for k, v in iter_hf_tensors(worker.module, worker.arch)}
        destroy_parallel()
    return out


@pytest.fixture(scope="module")
def converted(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Tiny random models, their checkpoints, the reference logits and the spawned results."""
    root = tmp_path_factory.mktemp("conversion_parity")
    originals = [make_hf_model(root, model_type, tie=tie) for model_type, tie in MODELS]
    ckpts = [convert(path, root / f"{path.name}-megatron", tp=2) for path in originals]
    ids = torch.randint(0, VOCAB, (2, 11), generator=torch.Generator().manual_seed(3))
    results = run_distributed(job_logits_and_export, 2, ckpts, originals, ids, timeout_s=300)
    return {"originals": originals, "ckpts": ckpts, "ids": ids, "rank0": results[0], "rank1": results[1]}


@pytest.mark.parametrize("index", range(len(MODELS)), ids=[f"{m}{'-tied' if t else ''}" for m, t in MODELS])
def test_converted_checkpoint_logits_match_transformers_at_tp1_and_tp2(converted: dict, index: int) -> None:
    original, ckpt = converted["originals"][index], converted["ckpts"][index]
    reference = hf_logits(original, converted["ids"])
    assert reference.abs().max() > 0.1  # a non-trivial model
    for tp in (1, 2):
        logits = converted["rank0"]["logits"][(ckpt.name, tp)]
        assert logits.shape == reference.shape
        assert (logits - reference).abs().max().item() <= 1e-4, f"TP={tp}"


@pytest.mark.parametrize("index", range(len(MODELS)), ids=[f"{m}{'-tied' if t else ''}" for m, t in MODELS])
def test_live_export_of_a_tp2_model_equals_the_original_hf_tensors(converted: dict, index: int) -> None:
    original, ckpt = converted["originals"][index], converted["ckpts"][index]
    expected = load_file(str(original / "model.safetensors"))
    exported = converted["rank0"]["export"][ckpt.name]
    assert sorted(exported) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(exported[name], tensor), name
    assert converted["rank1"]["export"][ckpt.name] == {}  # only global rank 0 yields
