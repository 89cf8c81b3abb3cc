"""`megatron-pc bench rollout`: both generators run on the same work and the figures come out
as one JSON object on stdout (vLLM's own log goes to stderr)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]


def test_bench_rollout_prints_figures_of_both_generators_as_json(tiny_model_dir: Path) -> None:
    prompts, n, max_tokens = 8, 4, 8
    cmd = [sys.executable, "-m", "megatron_pc", "bench", "rollout", "--model", str(tiny_model_dir), "--prompts", str(prompts),
           "--n", str(n), "--max-tokens", str(max_tokens), "--repeats", "1", "--pushes", "2", "--json"]  # fmt: skip
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(proc.stdout)  # nothing but the JSON object on stdout
    most = prompts * n * max_tokens
    for side in ("transformers", "vllm"):
        assert 0 < figures[side]["tokens"] <= most, figures
        assert figures[side]["tokens_per_s"] == pytest.approx(figures[side]["tokens"] / figures[side]["seconds"])
    assert figures["speedup"] == pytest.approx(figures["vllm"]["tokens_per_s"] / figures["transformers"]["tokens_per_s"])
    weights = sum(f.stat().st_size for f in tiny_model_dir.glob("*.safetensors"))
    # The push moves the full state dict: the checkpoint's tensors (its header aside).
    assert figures["vllm"]["push_mb"] * 1e6 == pytest.approx(weights, rel=0.05)
    assert figures["vllm"]["push_mb_per_s"] > 0
