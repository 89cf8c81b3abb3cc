#!/usr/bin/env python3
"""Can vLLM give the screen's prompt features? A pooling engine beside the rollout engines, measured.

    .venv/bin/python scripts/screen_features_vllm.py [CONFIG] [OVERRIDES...] [--prompts 256] [--repeats 3]

A vLLM engine answers ``LLM.embed`` only when started with ``runner="pooling"``; a rollout engine
(``runner="generate"``) refuses it. So this starts a second engine on the run's model with
``convert="embed"``, last-token pooling and no activation (``PoolingParams(use_activation=False)``:
no L2 normalisation), embeds ``--prompts`` training prompts ``--repeats`` times, prints the seconds
of each call and of the engine's start, and checks the vectors against transformers'
``output_hidden_states`` at each prompt's last token. docs/screen_features.md has the findings.
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def main() -> int:
    """Time vLLM's pooling runner on the run's prompts; a non-zero exit when it disagrees with transformers."""
    from megatron_pc.config import load_config
    from megatron_pc.driver.prepare import prepare
    from megatron_pc.rollout.vllm_engine import VllmEngine, checkpoint_dtype, import_vllm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/tiny_cpu.yaml")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest |difference| allowed against transformers")
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    data = prepare(cfg)
    prompts = [list(t) for t in data.train_tokens[: args.prompts]]
    VllmEngine._set_environment(cfg.rollout)  # the rollout engine's environment (KV cache size, in-process)
    vllm = import_vllm()
    from vllm.config import PoolerConfig
    from vllm.pooling_params import PoolingParams

    start = time.perf_counter()
    llm = vllm.LLM(model=str(data.model_path), runner="pooling", convert="embed",
                   pooler_config=PoolerConfig(seq_pooling_type="LAST"), dtype=checkpoint_dtype(data.model_path),
                   max_model_len=cfg.rollout.max_model_len, enforce_eager=cfg.rollout.enforce_eager, seed=cfg.seed)  # fmt: skip
    print(f"pooling engine started in {time.perf_counter() - start:.1f}s")
    requests = [{"prompt_token_ids": p} for p in prompts]
    for k in range(args.repeats):
        start = time.perf_counter()
        out = llm.embed(requests, pooling_params=PoolingParams(use_activation=False), use_tqdm=False)
        seconds = time.perf_counter() - start
        print(f"call {k}: {len(prompts)} prompts, {sum(map(len, prompts))} tokens, {seconds:.3f}s")
    ours = np.stack([np.asarray(o.outputs.embedding, dtype=np.float32) for o in out])
    from screen_features_seconds import hf_features

    reference = hf_features(str(data.model_path), prompts)
    worst = float(np.abs(ours - reference).max())
    print(f"features {ours.shape}: max |vllm - transformers| = {worst:.2e} (tolerance {args.tolerance:g})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    raise SystemExit(main())
