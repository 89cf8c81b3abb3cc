"""``megatron-pc bench NAME``: benchmarks that print figures. Each lives in its own module."""

from __future__ import annotations

import importlib
import sys

BENCHES: dict[str, tuple[str, str]] = {
    "controller": ("megatron_pc.bench.controller", "plan + observe time of one reference-size Pilot-Commit round"),
    "train": ("megatron_pc.bench.train", "log-prob and train-step tokens/s of the tiny config at TP=1 and TP=2"),
    "rollout": ("megatron_pc.bench.rollout", "vLLM vs transformers generation tokens/s, weight-sync MB/s"),
    "convert": ("megatron_pc.bench.convert", "HF <-> Megatron conversion time and peak memory"),
    "step": ("megatron_pc.bench.step", "throughput per training step of a config"),
    "datapath": ("megatron_pc.bench.datapath", "bytes the driver moves and its peak memory in one step's update, before and after"),
    "faults": ("megatron_pc.bench.faults", "the fault suite: faults injected into real runs and bad inputs, survived and refused"),
    "sweep": ("megatron_pc.bench.sweep", "history-aware Pilot-Commit vs PC, GRPO, DAPO on the simulator over a grid of task settings"),
    "rollouts": ("megatron_pc.bench.rollouts", "rollouts and seconds to target accuracies per task regime, over seeds; report and plots"),
}


def main(argv: list[str] | None = None) -> int:
    """Dispatch to one benchmark."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in BENCHES:
        width = max(map(len, BENCHES))
        print("usage: megatron-pc bench NAME [ARGS...]\n\nbenchmarks:")
        for name, (_, help_) in BENCHES.items():
            print(f"  {name.ljust(width)}  {help_}")
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    module = importlib.import_module(BENCHES[argv[0]][0])
    return int(module.main(argv[1:]) or 0)
