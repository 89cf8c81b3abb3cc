"""``megatron-pc bench train``: tokens/s of the Megatron policy's log-prob pass (forward only)
and train step (forward + backward + optimizer) on the tiny configuration, at TP=1 and TP=2.

The batch is the size of one training step of the config: train_batch x n sequences
(32 x 16 = 512 by default) of an arithmetic-sized prompt (6-10 tokens, mean 8) and a response
of max_tokens/2 .. max_tokens tokens (8-16). Token ids are random: throughput does not depend
on them. Each TP size runs in its own local gloo processes (as training does), warm-up
iterations are discarded, and the median of the timed iterations is reported, with each
process's peak RSS.
"""

from __future__ import annotations

import argparse
import logging
import random
import resource
import statistics
import tempfile
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from megatron_pc.config import Config, load_config
from megatron_pc.training.batching import Sequence

PROMPT_LENGTHS = (6, 10)
"""Prompt token range: "<bos>" + "a+b=" with 1-4 digit operands, as in the tiny task."""


@dataclass
class Result:
    """One TP size's figures."""

    tp: int
    logprob_s: float
    """Median seconds of one log-prob pass over the batch."""
    train_s: float
    """Median seconds of one train step over the batch."""
    tokens: int
    """Prompt + response tokens of the batch (padding not counted)."""
    peak_rss_mib: list[float]
    """Peak resident memory of each process (rank order)."""

    @property
    def logprob_tokens_per_s(self) -> float:
        """Log-prob throughput."""
        return self.tokens / self.logprob_s

    @property
    def train_tokens_per_s(self) -> float:
        """Train-step throughput."""
        return self.tokens / self.train_s


def make_sequences(count: int, vocab_size: int, max_tokens: int, seed: int) -> list[Sequence]:
    """``count`` random prompt + response sequences of the tiny task's lengths, advantages ±1."""
    rng = random.Random(seed)
    seqs = []
    for i in range(count):
        prompt = rng.randint(*PROMPT_LENGTHS)
        response = rng.randint(max(1, max_tokens // 2), max_tokens)
        # Ids above the 4 special tokens; the loss treats every id alike.
        tokens = [rng.randrange(4, vocab_size) for _ in range(prompt + response)]
        seqs.append(Sequence(tokens=tokens, prompt_len=prompt, advantage=1.0 if i % 2 == 0 else -1.0))
    return seqs


def _timed(fn: Callable[[], object], warmup: int, iters: int) -> list[float]:
    """Seconds of each of ``iters`` calls after ``warmup`` untimed ones. Barriers line the
    ranks up, so every rank times the same span (the slowest rank's)."""
    import torch.distributed as dist

    times = []
    for i in range(warmup + iters):
        dist.barrier()
        start = time.perf_counter()
        fn()
        dist.barrier()
        if i >= warmup:
            times.append(time.perf_counter() - start)
    return times


def _bench_job(cfg: Config, model_dir: str, tp: int, seqs: list[Sequence], warmup: int,
               iters: int) -> dict[str, object]:
    """Runs in every spawned process: build the policy, time log-probs then train steps."""
    from dataclasses import replace

    from megatron_pc.training.parallel import init_parallel
    from megatron_pc.training.worker import PolicyWorker

    logging.basicConfig(level=logging.WARNING)
    # Megatron's "TE/Apex absent, falling back" notices are expected on CPU (DESIGN.md) and
    # would bury the table.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.core")
    init_parallel(tp, 1, seed=cfg.seed)
    model_cfg = replace(cfg.model, path=model_dir, tensor_parallel=tp, pipeline_parallel=1)
    worker = PolicyWorker(model_cfg, cfg.training)
    worker.load_hf()
    logprob = _timed(lambda: worker.compute_logprobs(seqs), warmup, iters)
    train = _timed(lambda: worker.train_step(seqs), warmup, iters)
    # ru_maxrss is in KiB on Linux: the process's high-water mark, model build included.
    rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"logprob": logprob, "train": train, "rss_mib": rss_mib}


def bench_tp(cfg: Config, model_dir: str, tp: int, seqs: list[Sequence], warmup: int, iters: int) -> Result:
    """Time one TP size in ``tp`` fresh processes."""
    from megatron_pc.training.launch import run_distributed

    out = run_distributed(_bench_job, tp, cfg, model_dir, tp, seqs, warmup, iters, timeout_s=1800)
    # Barriers make the ranks' spans nearly equal; the slowest one is the step's time.
    logprob = [max(r["logprob"][i] for r in out) for i in range(iters)]
    train = [max(r["train"][i] for r in out) for i in range(iters)]
    return Result(tp=tp, logprob_s=statistics.median(logprob), train_s=statistics.median(train),
                  tokens=sum(len(s.tokens) for s in seqs), peak_rss_mib=[float(r["rss_mib"]) for r in out])


def _model_dir(cfg: Config, scratch: Path) -> tuple[str, str]:
    """(directory, description): the config's model, or a random model of the tiny shape.

    Throughput does not depend on the weights, so one warm-up step of ``make_tiny_model``
    (same shape and tokenizer as the real tiny policy) stands in when the model is missing."""
    if (Path(cfg.model.path) / "config.json").is_file():
        return cfg.model.path, cfg.model.path
    from megatron_pc.models.tiny import make_tiny_model

    made = make_tiny_model(scratch / "tiny-qwen2", warmup_steps=1, batch_size=8, eval_prompts=1, eval_samples=1)
    return str(made), f"tiny Qwen2, untrained ({cfg.model.path} does not exist)"


def format_table(results: list[Result]) -> str:
    """The printed table: one row per TP size."""
    head = f"{'TP':>3}  {'log-prob tok/s':>14}  {'train tok/s':>11}  {'log-prob s':>10}  {'train s':>8}  " \
           f"{'peak RSS MiB/process':>20}"
    rows = [head, "-" * len(head)]
    for r in results:
        rss = "/".join(f"{m:.0f}" for m in r.peak_rss_mib)
        rows.append(f"{r.tp:>3}  {r.logprob_tokens_per_s:>14,.0f}  {r.train_tokens_per_s:>11,.0f}  "
                    f"{r.logprob_s:>10.3f}  {r.train_s:>8.3f}  {rss:>20}")
    return "\n".join(rows)


def _int_list(text: str) -> list[int]:
    """``"1,2"`` -> ``[1, 2]``."""
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="megatron-pc bench train", description=__doc__.split("\n\n")[0])
    parser.add_argument("overrides", nargs="*", help="dotted config overrides, e.g. training.micro_batch_tokens=2048")
    parser.add_argument("--config", default=None, help="experiment YAML; default: the embedded tiny CPU configuration")
    # A comma list rather than nargs="+", which would swallow the positional overrides after it.
    parser.add_argument("--tp", type=_int_list, default=[1, 2],
                        help="comma-separated tensor-parallel sizes, one run each (default: 1,2; model.tensor_parallel "
                             "is ignored)")
    parser.add_argument("--iters", type=int, default=5, help="timed iterations per measurement (median reported)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed iterations before them")
    parser.add_argument("--batch", type=int, default=None,
                        help="sequences per step; default allocation.train_batch x allocation.n")
    args = parser.parse_args(argv)
    if args.iters < 1 or args.warmup < 0 or (args.batch is not None and args.batch < 1) or not args.tp or min(args.tp) < 1:
        parser.error("--iters, --batch and --tp must be >= 1 and --warmup >= 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Print log-prob and train-step tokens/s of the tiny configuration per TP size."""
    from megatron_pc.models.hf_config import check_parallel_sizes, load_arch
    from megatron_pc.training.setup import params_dtype

    args = _parse(argv)
    cfg = load_config(args.config, args.overrides)
    count = args.batch or cfg.allocation.train_batch * cfg.allocation.n
    with tempfile.TemporaryDirectory(prefix="mpc_bench_train_") as scratch:
        model_dir, described = _model_dir(cfg, Path(scratch))
        arch = load_arch(model_dir)
        for tp in args.tp:
            check_parallel_sizes(arch, tp, 1)  # fail before starting processes
        seqs = make_sequences(count, arch.vocab_size, cfg.rollout.max_tokens, cfg.seed)
        tokens = sum(len(s.tokens) for s in seqs)
        prompt, response = sum(s.prompt_len for s in seqs) / count, sum(s.response_len for s in seqs) / count
        dtype = str(params_dtype(cfg.model)).removeprefix("torch.")
        print(f"bench train: {count} sequences, {tokens:,} tokens (prompt {prompt:.1f} + response {response:.1f} "
              f"mean), micro-batches of <= {cfg.training.micro_batch_tokens} tokens, params {dtype}")
        print(f"model: {described}: {arch.num_layers} layers, hidden {arch.hidden_size}, vocab {arch.vocab_size}")
        print(f"median of {args.iters} iterations after {args.warmup} warm-up; one process per TP rank, "
              f"1 thread each", flush=True)
        results = [bench_tp(cfg, model_dir, tp, seqs, args.warmup, args.iters) for tp in args.tp]
    print(format_table(results))
    return 0
