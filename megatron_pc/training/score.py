"""``megatron-pc score``: per-token log-probs of given responses under a model.

Input lines ``{"prompt": str, "response": str}``; output lines add ``token_ids`` (the
response's tokens) and ``logprobs`` (one per response token). ``--load`` is an HF directory
or a checkpoint written by the policy worker. TP x PP processes are started here (gloo on
CPU); nobody has to call torchrun.
"""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

from megatron_pc.errors import DataError

logger = logging.getLogger(__name__)


def _read(path: Path) -> list[dict[str, str]]:
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        row = json.loads(line)
        if not isinstance(row.get("prompt"), str) or not isinstance(row.get("response"), str):
            raise DataError(f"{path}:{number}: needs string fields 'prompt' and 'response'")
        rows.append(row)
    return rows


def _score_job(load: str, tp: int, pp: int, rows: list[dict[str, str]]) -> list[dict] | None:
    """Runs in every spawned process; rank 0 returns the output rows."""
    import torch.distributed as dist
    from transformers import AutoTokenizer

    from megatron_pc.models.config import ModelConfig
    from megatron_pc.training import checkpoint
    from megatron_pc.training.batching import Sequence
    from megatron_pc.training.parallel import init_parallel
    from megatron_pc.training.worker import ReferenceWorker

    init_parallel(tp, pp)
    tokenizer = AutoTokenizer.from_pretrained(load)
    seqs = []
    for row in rows:
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        response = tokenizer(row["response"], add_special_tokens=False)["input_ids"]
        seqs.append(Sequence(tokens=prompt + response, prompt_len=len(prompt)))
    worker = ReferenceWorker(ModelConfig(path=load, tensor_parallel=tp, pipeline_parallel=pp))
    if checkpoint.is_checkpoint(load):
        checkpoint.load_model_only(worker, load)
    else:
        worker.load_hf()
    results = worker.compute_logprobs(seqs)
    if dist.get_rank() != 0:
        return None
    return [{**row, "token_ids": seq.tokens[seq.prompt_len:], "logprobs": lp.tolist()}
            for row, seq, (lp, _) in zip(rows, seqs, results)]


def main(argv: list[str] | None = None) -> int:
    """Score the responses of ``--input`` under ``--load``; write ``--output``."""
    from megatron_pc.models.hf_config import check_parallel_sizes, load_arch
    from megatron_pc.training.launch import run_distributed

    parser = argparse.ArgumentParser(prog="megatron-pc score", description=__doc__.splitlines()[0])
    parser.add_argument("--load", required=True, help="HF model directory or megatron-pc checkpoint")
    parser.add_argument("--input", required=True, type=Path, help="JSONL of {prompt, response}")
    parser.add_argument("--output", required=True, type=Path, help="JSONL to write")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size")
    args = parser.parse_args(argv)
    check_parallel_sizes(load_arch(args.load), args.tp, args.pp)  # fail before starting processes
    rows = _read(args.input)
    out = run_distributed(_score_job, args.tp * args.pp, args.load, args.tp, args.pp, rows)[0]
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text("".join(json.dumps(r) + "\n" for r in out))
    print(f"scored {len(out)} responses -> {args.output}")
    return 0
