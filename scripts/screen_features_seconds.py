#!/usr/bin/env python3
"""Seconds and tokens of the screen's prefill (megatron_pc.driver.screen) on a run's policy ranks.

    .venv/bin/python scripts/screen_features_seconds.py [CONFIG] [OVERRIDES...] [--prompts 256] [--repeats 3]

Starts the config's policy ranks on Ray (no engines), loads the model's HF weights, and asks for
the final hidden state of ``--prompts`` training prompts ``--repeats`` times (the first call
included: it is what a run's first screen costs). Prints the cost of each call, then checks the
features against transformers' ``output_hidden_states`` at each prompt's last token (fp32).
"""

from __future__ import annotations

import argparse
import time

import numpy as np


def hf_features(model_path: str, prompts: list[list[int]]) -> np.ndarray:
    """transformers' last hidden state (after the final norm) at each prompt's last token."""
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32, attn_implementation="eager")
    with torch.no_grad():
        rows = [model(torch.tensor([p]), output_hidden_states=True).hidden_states[-1][0, -1] for p in prompts]
    return torch.stack(rows).numpy()


def main() -> int:
    """Time the screen; a non-zero exit when the features differ from transformers'."""
    from megatron_pc.cluster.placement import Placement, start_ray, stop_ray
    from megatron_pc.cluster.policy_group import MegatronGroup
    from megatron_pc.config import load_config
    from megatron_pc.driver.screen import screen_features
    from megatron_pc.driver.prepare import prepare
    from megatron_pc.platform import devices

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config", nargs="?", default="configs/tiny_cpu.yaml")
    parser.add_argument("overrides", nargs="*")
    parser.add_argument("--prompts", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tolerance", type=float, default=1e-4, help="largest |difference| allowed against transformers")
    args = parser.parse_args()
    cfg = load_config(args.config, args.overrides)
    data = prepare(cfg)
    ids = list(range(min(args.prompts, len(data.train_tokens))))
    started = start_ray(cfg.cluster, bundles=cfg.policy_world + cfg.rollout.engines)
    placement = None
    try:
        placement = Placement(cfg.cluster, cfg.layout, use_gpu=devices.use_gpus())
        t0 = time.perf_counter()
        policy = MegatronGroup(cfg.model, cfg.training, cfg.seed, placement, trainable=True)
        policy.wait_ready()
        policy.load_hf(str(data.model_path))
        print(f"policy ranks ({cfg.policy_world}) started and loaded in {time.perf_counter() - t0:.1f}s")
        for k in range(args.repeats):
            features, cost = screen_features(policy, ids, data.train_tokens)
            print(f"call {k}: " + ", ".join(f"{name}={value:.3f}" if name == "screen_seconds" else f"{name}={value:.0f}"
                                            for name, value in cost.items()))  # fmt: skip
    finally:
        if placement is not None:
            placement.remove()
        stop_ray(started)
    ours = np.stack([features[p] for p in ids])
    reference = hf_features(str(data.model_path), [data.train_tokens[p] for p in ids])
    worst = float(np.abs(ours - reference).max())
    print(f"features {ours.shape}: max |megatron - transformers| = {worst:.2e} (tolerance {args.tolerance:g})")
    return 0 if worst <= args.tolerance else 1


if __name__ == "__main__":
    raise SystemExit(main())
