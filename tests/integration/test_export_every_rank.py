"""The per-GPU CUDA IPC sync's export on CPU: with ``every_rank``, every rank of a TP=2 x DP=2
policy (each DP replica's TP group gathering on its own) yields the full HF tensors, equal to
the checkpoint's; without it only global rank 0 does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from helpers.models import make_hf_model
from megatron_helpers import model_cfg
from megatron_pc.training.launch import run_distributed

pytestmark = pytest.mark.integration


def job_export(path: Path) -> dict[str, dict[str, torch.Tensor]]:
    from megatron_pc.models.export import iter_hf_tensors
    from megatron_pc.training.parallel import init_parallel
    from megatron_pc.training.worker import ReferenceWorker

    init_parallel(2, 1, seed=0)
    worker = ReferenceWorker(model_cfg(path, 2))
    worker.load_hf()
    every = {n: t.clone() for n, t in iter_hf_tensors(worker.module, worker.arch, every_rank=True)}
    rank0 = {n: t.clone() for n, t in iter_hf_tensors(worker.module, worker.arch)}
    return {"every": every, "rank0": rank0}


def test_every_rank_of_every_replica_yields_the_full_hf_tensors(tmp_path: Path) -> None:
    original = make_hf_model(tmp_path, "qwen2", tie=False, layers=2)
    results = run_distributed(job_export, 4, original, timeout_s=600)
    expected = load_file(str(original / "model.safetensors"))
    assert len(results) == 4
    for rank, got in enumerate(results):
        assert sorted(got["every"]) == sorted(expected), rank
        assert all(torch.equal(got["every"][n], t) for n, t in expected.items()), rank
        assert (got["rank0"] != {}) == (rank == 0)
