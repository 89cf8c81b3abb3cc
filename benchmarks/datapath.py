"""``megatron-pc bench datapath [CONFIG]``: what one training step's data path costs the driver.

For a config's batch shape (default: the Qwen3-14B config) it builds one step of rollouts,
with prompt and response lengths drawn from a seeded distribution, and drives the step's
update through both methods against in-process stand-ins for every rank:

    before   the method up to 0.5: the global batch as Python lists, sent to every rank for the
             old log-probs, again for the reference log-probs, and again for each mini-batch's
             update; rank 0 sends the log-probs back as lists
    after    megatron_pc.driver.update: each DP group's share, as numpy arrays, put into the
             object store once; the log-probs stay on the workers; scalars come back

Bytes are what the real serialisation produces: Ray pickles the arguments of every actor call
(protocol 5; numpy arrays travel as out-of-band buffers, without a copy on the driver), so a
call's bytes are counted once per rank it goes to. The driver's peak is its Python heap
(tracemalloc, numpy included) over the data path, above the rollouts it already holds, plus
what it keeps in the object store at once: the serialised arguments of one group call to all
ranks (before; Ray holds them until every rank has run) or the DP shares (after). "One copy
of the batch" is its token ids (int32) and engine log-probs (float32) as flat arrays.
"""

from __future__ import annotations

import argparse
import json
import pickle
import time
import tracemalloc
from dataclasses import dataclass
from typing import Any

import numpy as np

from megatron_pc.allocation import Rollout, TrainGroup
from megatron_pc.driver.update import groups_to_sequences, plan_rows
from megatron_pc.config import Config, load_config
from megatron_pc.config_cli import split_config_args
from megatron_pc.training.payload import RolloutPayload, split_by_tokens

DEFAULT_CONFIG = "configs/qwen3_14b.yaml"


def serialized_bytes(obj: Any) -> int:
    """Bytes of ``obj`` as Ray serialises a call's argument (pickle 5, out-of-band buffers)."""
    buffers: list[pickle.PickleBuffer] = []
    inband = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    return len(inband) + sum(b.raw().nbytes for b in buffers)


@dataclass
class Shape:
    """The batch of one step."""

    groups: int
    rollouts_per_group: int
    prompt_tokens: list[int]
    response_tokens: list[list[int]]
    ranks: int
    dp: int
    vocab: int

    @property
    def sequences(self) -> int:
        return self.groups * self.rollouts_per_group

    @property
    def tokens(self) -> int:
        return sum(p * self.rollouts_per_group for p in self.prompt_tokens) + sum(map(sum, self.response_tokens))


def draw_shape(cfg: Config, seed: int, response_median: float | None) -> Shape:
    """Prompt lengths uniform in [64, max_prompt_tokens / 2]; response lengths lognormal
    (median ``response_median``, default max_tokens / 4; sigma 0.8), cut at max_tokens."""
    rng = np.random.default_rng(seed)
    a, r = cfg.allocation, cfg.rollout
    median = response_median or r.max_tokens / 4
    prompts = rng.integers(64, max(65, cfg.data.max_prompt_tokens // 2), size=a.train_batch).tolist()
    responses = np.clip(rng.lognormal(np.log(median), 0.8, size=(a.train_batch, a.n)), 16, r.max_tokens).astype(int).tolist()
    ranks = cfg.policy_world
    return Shape(a.train_batch, a.n, prompts, responses, ranks, cfg.cluster.data_parallel, 151_000)


def make_groups(shape: Shape, seed: int) -> list[TrainGroup]:
    """The step's train groups (rollouts with numpy payloads carrying their prompt, as the
    driver builds them)."""
    rng = np.random.default_rng(seed + 1)
    prompts = [rng.integers(0, shape.vocab, size=n, dtype=np.int32) for n in shape.prompt_tokens]
    groups = []
    for g, lengths in enumerate(shape.response_tokens):
        rollouts = [Rollout(float(k % 2), bool(k % 2), RolloutPayload(rng.integers(0, shape.vocab, size=n, dtype=np.int32),
                                                                     -rng.random(n, dtype=np.float32), "stop", prompts[g]))
                    for k, n in enumerate(lengths)]  # fmt: skip
        groups.append(TrainGroup(g, rollouts, step=1))
    return groups


class Meter:
    """Bytes the driver sends and receives, and the most it holds in the object store at once."""

    def __init__(self) -> None:
        self.sent = 0
        self.received = 0
        self.in_store = 0

    def call(self, per_rank_args: list[Any]) -> None:
        """One group call: each rank's arguments serialised (and held until the call ends)."""
        sizes = [serialized_bytes(a) for a in per_rank_args]
        self.sent += sum(sizes)
        self.in_store = max(self.in_store, sum(sizes))

    def call_same(self, args: Any, ranks: int) -> None:
        """One group call with the same arguments to every rank (serialised once per rank)."""
        size = serialized_bytes(args)
        self.sent += size * ranks
        self.in_store = max(self.in_store, size * ranks)

    def back(self, results: list[Any]) -> None:
        self.received += sum(serialized_bytes(r) for r in results)


def run_before(cfg: Config, shape: Shape, groups: list[TrainGroup]) -> Meter:
    """The driver of 0.5: Python lists to every rank, three times over."""
    meter = Meter()
    seqs = groups_to_sequences(groups, cfg.training.std_normalize)
    meter.call_same((seqs,), shape.ranks)  # old log-probs: the global batch to every rank
    old = [(-np.random.default_rng(0).random(s.response_len)).tolist() for s in seqs]
    meter.back([old] + [None] * (shape.ranks - 1))  # rank 0 answers, as lists
    for s, lp in zip(seqs, old):
        s.old_logprobs = lp
    if cfg.training.kl_coef > 0:
        meter.call_same((seqs,), shape.ranks)
        meter.back([old] + [None] * (shape.ranks - 1))
        for s, lp in zip(seqs, old):
            s.ref_logprobs = lp
    del old
    plan = plan_rows(groups, cfg)  # the same mini-batches, over the same rows
    for k, scale in enumerate(plan.loss_scales):
        batch = [seqs[i] for i in np.flatnonzero(plan.update == k)]
        meter.call_same((batch, scale, False), shape.ranks)
        meter.back([{"loss": 0.0, "grad_norm": 0.0, "update_ok": 1.0, "lr": 0.0}] * shape.ranks)
    return meter


def run_after(cfg: Config, shape: Shape, groups: list[TrainGroup]) -> Meter:
    """megatron_pc.driver.update's driver: one share per DP group, once; scalars back."""
    meter = Meter()
    plan = plan_rows(groups, cfg)
    held = 0
    for rows in split_by_tokens(plan.lengths, plan.update, len(plan.denominators), shape.dp):
        share = plan.build(rows)
        size = serialized_bytes(share)  # ray.put: once per DP group
        meter.sent += size
        held += size
        del share
    meter.in_store = held
    per_rank = shape.ranks
    handle = b"x" * 28  # an ObjectRef as Ray serialises it (28-byte id plus its owner's address)
    meter.call([(handle,)] * per_rank)  # load_rows: each rank its group's handle
    meter.back([0] * per_rank)
    meter.call([()] * per_rank)  # old_logprobs, kept on the workers
    meter.back([None] * per_rank)
    if cfg.training.kl_coef > 0:
        meter.call([(handle,)] * per_rank)
        meter.back([0] * per_rank)
        meter.call([()] * per_rank)
        meter.back([handle] * shape.dp + [None] * (per_rank - shape.dp))  # a handle per DP group
        meter.call([(handle,)] * per_rank)
        meter.back([None] * per_rank)
    for k in range(len(plan.denominators)):
        meter.call([(k, False)] * per_rank)
        meter.back([{"loss": 0.0, "grad_norm": 0.0, "update_ok": 1.0, "lr": 0.0}] * per_rank)
    return meter


def measure(method: Any, *args: Any) -> dict[str, float]:
    """Run one method under tracemalloc; its bytes, peak and seconds."""
    tracemalloc.start()
    start = time.perf_counter()
    base = tracemalloc.get_traced_memory()[0]
    meter = method(*args)
    peak = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    return {
        "driver_bytes_per_step": float(meter.sent + meter.received),
        "driver_sent_bytes": float(meter.sent),
        "driver_received_bytes": float(meter.received),
        "driver_heap_peak_bytes": float(peak),
        "driver_store_peak_bytes": float(meter.in_store),
        "driver_peak_bytes": float(peak + meter.in_store),
        "seconds": time.perf_counter() - start,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="megatron-pc bench datapath", description=__doc__.split("\n\n")[0].split(": ", 1)[1])
    parser.add_argument("config", nargs="?", default=None, help=f"experiment YAML (default: {DEFAULT_CONFIG})")
    parser.add_argument("overrides", nargs="*", help="dotted overrides, e.g. allocation.train_batch=32")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--response-median", type=float, default=None, help="median response tokens (default: max_tokens / 4)")
    parser.add_argument("--methods", default="before,after", help="comma-separated, from before, after")
    parser.add_argument("--json", action="store_true", help="print one JSON object (keys before and after)")
    args = parser.parse_intermixed_args(argv)
    config, overrides = split_config_args(args.config, args.overrides)
    cfg = load_config(config or DEFAULT_CONFIG, overrides)
    shape = draw_shape(cfg, args.seed, args.response_median)
    groups = make_groups(shape, args.seed)
    copy = 4 * shape.tokens + 4 * sum(map(sum, shape.response_tokens))
    out: dict[str, Any] = {
        "config": cfg.name, "sequences": shape.sequences, "tokens": shape.tokens, "ranks": shape.ranks,
        "data_parallel": shape.dp, "batch_copy_bytes": copy,
    }  # fmt: skip
    methods = {"before": run_before, "after": run_after}
    for name in args.methods.split(","):
        if name not in methods:
            parser.error(f"--methods: unknown method {name!r} (before, after)")
        out[name] = measure(methods[name], cfg, shape, groups)
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    print(f"bench datapath: {cfg.name}, {shape.sequences:,} sequences, {shape.tokens / 1e6:.1f}M tokens, "
          f"{shape.ranks} ranks ({shape.dp} DP groups); one copy of the batch {copy / 2**20:,.0f} MiB")
    print("| method | driver bytes/step | x batch copy | sent | received | driver peak | x batch copy | seconds |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in methods:
        if name in out:
            m = out[name]
            print(f"| {name} | {m['driver_bytes_per_step'] / 2**30:,.2f} GiB | {m['driver_bytes_per_step'] / copy:,.1f} | "
                  f"{m['driver_sent_bytes'] / 2**30:,.2f} GiB | {m['driver_received_bytes'] / 2**20:,.1f} MiB | "
                  f"{m['driver_peak_bytes'] / 2**30:,.2f} GiB | {m['driver_peak_bytes'] / copy:,.2f} | {m['seconds']:.1f} |")
    return 0
