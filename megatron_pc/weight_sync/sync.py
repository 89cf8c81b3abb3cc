"""The driver's side of a weight sync: stream policy rank 0's buckets into every engine actor
through the run's transport, opening the transport's channel first when it has one."""

from __future__ import annotations

import logging
import time
from typing import Any

from megatron_pc.weight_sync.buckets import DEFAULT_TIMEOUT_S
from megatron_pc.weight_sync.transports import get_transport

logger = logging.getLogger(__name__)


def sync_weights(policy: Any, engines: Any, bucket_mb: int, transport: str = "object_store") -> dict[str, float]:
    """Stream the policy's weights (HF names, full tensors) into every engine, bucket by bucket.

    ``transport`` is a resolved ``rollout.weight_transport`` (see weight_sync.transports).
    Bucket k is loading into the engines while bucket k+1 is being gathered; peak memory stays
    near two buckets. Returns seconds and MB moved.
    """
    kind = get_transport(transport)
    start = time.perf_counter()
    if kind.has_channel:
        _connect_weight_channel(policy, engines, transport)
    send, load = kind.send_method, kind.load_method
    pending: list[tuple[Any, Any]] = []
    moved = 0
    for ref in policy.export_buckets(bucket_mb * 2**20, send):
        pending += [(engine, getattr(engine.actor, load).remote(ref)) for engine in engines.engines]
    for engine, done in pending:
        moved += engine.result(done)["bytes"]  # an engine that died raises its EngineError
    moved //= max(len(engines.engines), 1)
    seconds = time.perf_counter() - start
    return {"sync_seconds": seconds, "sync_mb": moved / 1e6, "sync_mb_per_s": moved / 1e6 / seconds if seconds else 0.0}


def _connect_weight_channel(policy: Any, engines: Any, transport: str) -> None:
    """Open rank 0's channel to the current engine actors, unless it is open already (a
    restarted engine is a new actor: then everyone joins a new channel)."""
    import ray

    timeout_s = DEFAULT_TIMEOUT_S
    key = (transport, tuple(engines.engines))  # engines compare by identity
    if policy.weight_channel == key:
        return
    sender = policy.actors[0]
    names = [engine.name for engine in engines.engines]
    address = ray.get(sender.open_weight_channel.remote(transport, names, timeout_s))
    size = len(names) + 1
    joins = [engine.actor.join_weight_channel.remote(transport, address, k + 1, size, timeout_s) for k, engine in enumerate(engines.engines)]
    ray.get([sender.connect_weight_channel.remote(), *joins])
    policy.weight_channel = key
    logger.info("weight sync: %s channel at %s to %s", transport, address, ", ".join(names))
