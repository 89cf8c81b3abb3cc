"""The projected weight sync ("refit") of a config's model per transport, from the bytes moved and
stated bandwidths; printed by ``megatron-pc project`` (docs/weight_sync.md, "Projection").

Each transport is a chain of stages; a stage moves some bytes over one link. The projection is
the SUM of its stages plus a fixed cost per bucket and one per decoder layer, both measured
(conservative: buckets pipeline the stages, so a real sync lies between the slowest stage and
this sum). Buckets keep a decoder layer whole (weight_sync/buckets.py), so their number is
that of ``memory_model.sync_buckets``, not the bytes over ``rollout.sync_bucket_mb``. M is the model's bytes in
bf16 (2 x parameters); t_p the policy's TP, t_e an engine's TP, E engines, N nodes.

    cuda_ipc (colocated, per GPU: every policy rank of every DP replica feeds the engine worker
    on its GPU)
        TP all-gather into full HF tensors  M (t_p - 1) / t_p   over NVLink
        pack each bucket (GPU copy)         2 M                 over HBM (read + write)
        each worker loads its shard         2 M / t_e           over HBM
    broadcast (split: NCCL from policy rank 0 to every engine worker)
        TP all-gather on the policy         M (t_p - 1) / t_p   over NVLink
        pack                                2 M                 over HBM
        pipelined broadcast to E t_e GPUs   M                   over one NIC (a ring is as fast as its slowest link)
        each worker loads its shard         2 M / t_e           over HBM
    object_store (CPU fallback: rank 0 gathers, copies to host, Ray moves the objects)
        TP all-gather on the policy         M (t_p - 1) / t_p   over NVLink
        copy to host                        M                   over PCIe
        put into the object store           M                   host memory copy (pickle)
        to every other node, from rank 0's  (N - 1) M           over rank 0's NIC
        actor reads it, hands it to workers (1 + t_e) M         host memory copy (unpickle, shared-memory queue)
        each worker copies it to its GPU    M                   over PCIe
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from megatron_pc.launch.memory_model import sync_buckets
from megatron_pc.models.shapes import ModelShape

# Stated bandwidths, GB/s per direction, and where each number comes from.
NVLINK_GBPS = {"H200": 450.0, "H100": 450.0, "A100": 300.0}
"""NVLink per GPU per direction: H100/H200 SXM NVLink 4 is 900 GB/s bidirectional (NVIDIA H100
and H200 data sheets); A100 SXM NVLink 3 600 GB/s bidirectional (A100 data sheet)."""
PCIE_GBPS = 64.0
"""PCIe Gen5 x16 per direction: 32 GT/s x 16 lanes x 128/130 encoding = 63 GB/s (PCI-SIG Gen5 spec;
the H100/H200 SXM host interface)."""
NETWORK_GBPS = 50.0
"""One 400 Gb/s NDR InfiniBand NIC (ConnectX-7) per GPU, as in a DGX H100/H200 (8 per node):
400 Gb/s = 50 GB/s."""
HOST_COPY_GBPS = 10.0
"""One CPU thread copying (or pickling) tensors in host memory: an assumption (single-stream
memcpy on server CPUs runs at ~10-20 GB/s); the object store's put, get and vLLM's
shared-memory queue each copy once per reader."""
EFFICIENCY = 0.8
"""Share of each link's bandwidth a transfer reaches (assumption)."""
BUCKET_LATENCY_S = 0.00215
"""Fixed cost per bucket, measured on CPU (``megatron-pc bench weight-sync``, 2 shared cores at a
load average of 100-380, docs/weight_sync.md): the driver's Ray actor call to an engine (2.15 ms,
median of 50), the engine's ``collective_rpc`` to its in-process worker (< 0.01 ms) and the
acknowledgement through the channel's store (not separable from 0), plus the reload pass's
per-bucket term (fitted below 0, taken as 0)."""
LAYER_RELOAD_S = 0.085
"""Fixed cost per decoder layer of the reload pass (the layer's modules taken apart, loaded and
processed), fitted on CPU over buckets of 1, 2 and 4 layers of the tiny model and SmolLM2 with
the bytes fitted apart (2.2 ms a MiB); paid once a sync whatever the bucket size. On CPU it
includes vLLM's repacking of every weight for its CPU kernels, which the GPU does not do: an
upper bound for a GPU, where nothing has measured it."""


@dataclass
class Links:
    """The bandwidths (GB/s, per direction) and per-bucket latency a projection assumes."""

    nvlink_gbps: float
    hbm_gbps: float
    pcie_gbps: float = PCIE_GBPS
    network_gbps: float = NETWORK_GBPS
    host_copy_gbps: float = HOST_COPY_GBPS
    efficiency: float = EFFICIENCY
    bucket_latency_s: float = BUCKET_LATENCY_S
    layer_reload_s: float = LAYER_RELOAD_S

    @classmethod
    def for_gpu(cls, gpu: str, hbm_tbps: float) -> "Links":
        """The stated links of ``gpu`` (HBM from project.HBM_TBPS)."""
        return cls(nvlink_gbps=NVLINK_GBPS[gpu], hbm_gbps=hbm_tbps * 1000.0)


def refit(shape: ModelShape, cfg: Any, links: Links, nodes: int) -> dict[str, Any]:
    """Seconds per stage and in all of one weight sync of ``shape`` per transport, for the
    config's policy TP, engines, engine TP and ``rollout.sync_bucket_mb``."""
    m = 2.0 * shape.total_params  # bf16 bytes
    tp, te, engines = cfg.model.tensor_parallel, cfg.rollout.tensor_parallel, cfg.rollout.engines
    buckets = len(sync_buckets(shape, cfg.rollout.sync_bucket_mb))
    e = links.efficiency

    def over(nbytes: float, gbps: float) -> float:
        return nbytes / (gbps * 1e9 * e)

    gather = over(m * (tp - 1) / tp, links.nvlink_gbps)
    pack = over(2 * m, links.hbm_gbps)
    load = over(2 * m / te, links.hbm_gbps)
    stages = {
        "cuda_ipc": {"tp_gather": gather, "pack": pack, "load": load},
        "broadcast": {"tp_gather": gather, "pack": pack, "broadcast": over(m, links.network_gbps), "load": load},
        "object_store": {"tp_gather": gather, "to_host": over(m, links.pcie_gbps), "put": over(m, links.host_copy_gbps),
                         "to_nodes": over((nodes - 1) * m, links.network_gbps), "to_workers": over((1 + te) * m, links.host_copy_gbps),
                         "to_gpu": over(m, links.pcie_gbps)},
    }  # fmt: skip
    out: dict[str, Any] = {}
    for name, parts in stages.items():
        parts["bucket_latency"] = buckets * links.bucket_latency_s
        parts["layer_reload"] = shape.layers * links.layer_reload_s
        out[name] = {"stages_s": parts, "total_s": sum(parts.values()), "slowest_stage": max(parts, key=parts.__getitem__)}
    return {"model": shape.name, "bytes": m, "buckets": buckets, "bucket_mb": cfg.rollout.sync_bucket_mb, "policy_tp": tp,
            "engine_tp": te, "engines": engines, "nodes": nodes, "links": asdict(links), "transports": out,
            "goal_s": {"cuda_ipc": REFIT_GOAL_S}}  # fmt: skip


REFIT_GOAL_S = 2.0
"""The goal for the colocated CUDA IPC refit of a 14B model (issue 26; NeMo-RL refits a 30B MoE
in about 1 s on H100)."""


def format_refit(result: dict[str, Any]) -> list[str]:
    """The refit projection as lines of text."""
    gb = result["bytes"] / 1e9
    lines = [f"weight sync (refit) of {result['model']}: {gb:.2f} GB in bf16, {result['buckets']} buckets of {result['bucket_mb']} MiB, "
             f"policy TP {result['policy_tp']}, {result['engines']} engines of TP {result['engine_tp']}, {result['nodes']} nodes",
             "| transport | stages (s) | total s |", "|---|---|---|"]  # fmt: skip
    for name, t in result["transports"].items():
        stages = ", ".join(f"{k} {v:.3f}" for k, v in t["stages_s"].items())
        goal = result["goal_s"].get(name)
        mark = "" if goal is None else f" (goal <= {goal:.0f} s: {'met' if t['total_s'] <= goal else 'NOT met'})"
        lines.append(f"| {name} | {stages} | {t['total_s']:.2f}{mark} |")
    links = result["links"]
    lines.append(f"links (GB/s per direction, at {links['efficiency']:.0%}): NVLink {links['nvlink_gbps']:.0f}, HBM {links['hbm_gbps']:.0f}, "
                 f"PCIe {links['pcie_gbps']:.0f}, network {links['network_gbps']:.0f}, host copy {links['host_copy_gbps']:.0f}; "
                 f"{links['bucket_latency_s'] * 1e3:.1f} ms per bucket and {links['layer_reload_s'] * 1e3:.1f} ms per layer "
                 "(measured on CPU: megatron-pc bench weight-sync; sources: megatron_pc/launch/refit.py)")  # fmt: skip
    return lines
