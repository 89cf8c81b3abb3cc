"""Real weights: SmolLM2-135M (9 heads / 3 KV heads, tied embeddings) converted to Megatron
gives the logits of transformers at TP=1 and TP=3, comes back bit for bit, loads in vLLM
with the greedy continuations of transformers; and the conversion benchmark runs on it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from conversion import hf_to_megatron, megatron_to_hf
from megatron_helpers import hf_logits
from megatron_pc.training.launch import run_distributed
from test_conversion_vllm import hf_greedy, vllm_greedy

pytestmark = pytest.mark.integration

VOCAB = 49152


@pytest.fixture(scope="module")
def smollm2(smollm2_dir: Path) -> Path:
    """SmolLM2-135M-Instruct as a plain HF directory (the session's, made once)."""
    return smollm2_dir


@pytest.fixture(scope="module")
def converted(smollm2: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("smollm2_conv")
    ckpt = hf_to_megatron.convert(smollm2, root / "ckpt", tp=3)
    return {"ckpt": ckpt, "hf": megatron_to_hf.convert(ckpt, root / "hf", max_shard_size="200MB")}


def job_logits(original: Path, ckpt: Path, ids: torch.Tensor) -> dict[int, torch.Tensor]:
    """Logits of the converted checkpoint at TP=1 and at TP=3 (same 3 processes)."""
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from megatron_helpers import model_cfg
    from megatron_pc.training.checkpoint import load_model_only
    from megatron_pc.training.parallel import destroy_parallel, init_parallel
    from megatron_pc.training.worker import ReferenceWorker

    out = {}
    for tp in (1, 3):
        init_parallel(tp, 1)
        worker = ReferenceWorker(model_cfg(original, tp))
        load_model_only(worker, ckpt)
        with torch.no_grad():
            logits = worker.module(ids, torch.arange(ids.shape[1]).expand_as(ids), None)
        out[tp] = gather_from_tensor_model_parallel_region(logits)[..., :VOCAB].clone()
        del worker
        destroy_parallel()
    return out


def test_converted_smollm2_logits_match_transformers_at_tp1_and_tp3(smollm2: Path, converted: dict) -> None:
    ids = torch.randint(0, VOCAB, (1, 12), generator=torch.Generator().manual_seed(5))
    reference = hf_logits(smollm2, ids)
    logits = run_distributed(job_logits, 3, smollm2, converted["ckpt"], ids, timeout_s=400)[0]
    for tp in (1, 3):
        assert logits[tp].shape == reference.shape
        assert (logits[tp] - reference).abs().max().item() <= 1e-4, f"TP={tp}"


def test_smollm2_comes_back_bit_for_bit_in_size_bounded_shards(smollm2: Path, converted: dict) -> None:
    expected = load_file(str(smollm2 / "model.safetensors"))
    files = sorted(converted["hf"].glob("model-*.safetensors"))
    assert len(files) >= 3 and all(f.stat().st_size <= 200e6 + 1e6 for f in files)
    back = {k: v for f in files for k, v in load_file(str(f)).items()}
    assert sorted(back) == sorted(expected)
    assert all(torch.equal(back[name], tensor) for name, tensor in expected.items())
    assert (converted["hf"] / "tokenizer.json").is_file() or (converted["hf"] / "tokenizer_config.json").is_file()


def test_exported_smollm2_loads_in_vllm_and_matches_transformers_greedy(smollm2: Path, converted: dict) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(converted["hf"])
    prompts = [tok(p)["input_ids"] for p in ["The capital of France is", "def fibonacci(n):", "1, 2, 3, 4,"]]
    expected = hf_greedy(smollm2, prompts, 8)
    assert vllm_greedy(converted["hf"], prompts, 8) == expected


def test_bench_convert_prints_time_and_peak_memory_both_ways(smollm2: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    from benchmarks.cli import main

    assert main(["convert", "--hf", str(smollm2), "--work-dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    rows = {line.split()[0]: line.split()[1:] for line in lines if line.split() and "-to-" in line.split()[0]}
    assert set(rows) == {"hf-to-megatron", "megatron-to-hf"}
    for seconds, rss, weights in rows.values():
        assert float(seconds) > 0 and int(rss) > 100 and int(weights) > 400  # MiB; SmolLM2 is ~513 MiB
