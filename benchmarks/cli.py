"""``megatron-pc bench NAME``: benchmarks that print figures. Each lives in its own module."""

from __future__ import annotations

import sys

from megatron_pc.commands import CommandTable

BENCHES = CommandTable("megatron-pc bench", {
    "controller": ("benchmarks.controller:main", "plan + observe time of one reference-size Pilot-Commit round"),
    "train": ("benchmarks.train:main", "log-prob and train-step tokens/s of the tiny config at TP=1 and TP=2"),
    "rollout": ("benchmarks.generation:main", "vLLM vs transformers generation tokens/s, weight-sync MB/s"),
    "convert": ("benchmarks.convert:main", "HF <-> Megatron conversion time and peak memory"),
    "step": ("benchmarks.step:main", "throughput per training step of a config"),
    "datapath": ("benchmarks.datapath:main", "bytes the driver moves and its peak memory in one step's update, before and after"),
    "faults": ("benchmarks.faults:main", "the fault suite: faults injected into real runs and bad inputs, survived and refused"),
    "sweep": ("benchmarks.sweep:main", "history-aware Pilot-Commit vs PC, GRPO, DAPO on the simulator over a grid of task settings"),
    "weight-sync": ("benchmarks.weight_sync:main", "per-bucket overhead of the weight sync (Ray call, reload pass, acknowledgement) on CPU"),
    "activations": ("benchmarks.activations:main", "saved-activation bytes of one Megatron layer per token and per score element (the memory model's term)"),
    "rollouts": ("benchmarks.strategies:main", "rollouts and seconds to target accuracies per task regime, over seeds; report and plots"),
}, metavar="NAME", heading="benchmarks")


def main(argv: list[str] | None = None) -> int:
    """Dispatch to one benchmark."""
    return BENCHES.dispatch(list(sys.argv[1:] if argv is None else argv))
