"""The driver's side of a weight sync: open the run's channel from policy rank 0 to every engine
worker (once, again after an engine restart), then hand each bucket's payload, as rank 0's
sender streams it, to every engine with one typed call, ``engines.update_weights(payload)``."""

from __future__ import annotations

import logging
import time
from typing import Any

from megatron_pc.weight_sync.buckets import DEFAULT_TIMEOUT_S, TransportError
from megatron_pc.weight_sync.rendezvous import Rendezvous
from megatron_pc.weight_sync.transports import get_transport

logger = logging.getLogger(__name__)


def sync_weights(policy: Any, engines: Any, bucket_mb: int, transport: str = "object_store") -> dict[str, float]:
    """Stream the policy's weights (HF names, full tensors) into every engine, bucket by bucket.

    ``policy`` is the policy's MegatronGroup, ``engines`` an EngineGroup; ``transport`` a
    resolved ``rollout.weight_transport``. The engines load bucket k while rank 0 gathers bucket
    k+1; rank 0's sender puts bucket k+2 only after every engine worker acknowledged bucket k.
    Returns seconds and MB moved, and what the sender measured in flight.
    """
    per_gpu = get_transport(transport).sender.per_gpu  # an unknown name fails here, naming the choices
    start = time.perf_counter()
    _connect(policy, engines, transport)
    moved = 0
    try:
        for payload in policy.push_weights(bucket_mb * 2**20, per_gpu=per_gpu):
            moved += engines.update_weights(payload)[0].bytes  # an engine that died raises its EngineError
    except Exception:
        _abort(policy.weight_channel[2] if policy.weight_channel is not None else ())
        policy.weight_channel = None
        raise
    seconds = time.perf_counter() - start
    sent = policy.weight_sync_stats()
    return {
        "sync_seconds": seconds, "sync_mb": moved / 1e6, "sync_mb_per_s": moved / 1e6 / seconds if seconds else 0.0,
        "sync_buckets": sent["buckets"], "sync_bucket_mb_max": sent["max_bucket_bytes"] / 1e6,
        "sync_inflight_buckets_max": sent["max_in_flight_buckets"], "sync_inflight_mb_max": sent["max_in_flight_bytes"] / 1e6,
    }  # fmt: skip


def _abort(addresses: tuple[str, ...] | list[str]) -> None:
    """An engine failed joining or mid-sync: stop the senders at ``addresses`` from waiting for
    joins or acknowledgements that will never come (they finish their gathers and end), so the
    policy ranks are free for the next sync on a new channel."""
    for address in addresses:
        try:
            Rendezvous.join(address, timeout_s=30.0).abort()
        except TransportError:
            logger.warning("weight sync: could not abort the channel at %s", address, exc_info=True)


def _connect(policy: Any, engines: Any, transport: str) -> None:
    """Open rank 0's channel to the current engines' workers, unless it is open already (a
    restarted engine is a new actor: then everyone joins a new channel)."""
    key = (transport, tuple(engines.engines))  # engines compare by identity
    if policy.weight_channel is not None and policy.weight_channel[:2] == key:
        return
    receivers = engines.weight_receivers
    opened: list[str] = []

    def join(address: str, by_gpu: dict[str, str] | None) -> None:
        opened.extend(by_gpu.values() if by_gpu else [address])
        try:
            engines.join_weight_channel(transport, address, DEFAULT_TIMEOUT_S, by_gpu)
        except Exception:
            _abort(opened)  # the ranks wait for the joins in connect_weight_channel: free them now
            raise

    address = policy.open_weight_channel(transport, receivers, DEFAULT_TIMEOUT_S,
                                         join=join)
    policy.weight_channel = (*key, tuple(opened))
    logger.info("weight sync: %s channel at %s to %s", transport, address, ", ".join(receivers))
