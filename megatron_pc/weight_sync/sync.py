"""The driver's side of a weight sync: the two ends it joins, and the channel between them.

A :class:`Source` is the policy side (megatron_pc.cluster.policy_group.MegatronGroup: its ranks
send, :mod:`.sending`); a :class:`Sink` is the engine side (megatron_pc.rollout.group.EngineGroup:
every engine's workers receive, :mod:`.engine_side`). :class:`WeightSync` holds the one piece of
state a run's syncs share, the open :class:`Channel`: it opens one from the policy's sender(s)
to every engine worker on the first sync, reuses it while the engines are the same, opens a new
one when an engine was replaced, and drops it when a sync failed. Per sync it hands each bucket's
payload, as the sender streams it, to every engine with one typed call,
``sink.update_weights(payload)``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from megatron_pc.weight_sync.buckets import DEFAULT_TIMEOUT_S, TransportError
from megatron_pc.weight_sync.rendezvous import Rendezvous
from megatron_pc.weight_sync.transports import get_transport

logger = logging.getLogger(__name__)


class Source(Protocol):
    """The policy side of a sync: its ranks' senders (megatron_pc.cluster.policy_group.MegatronGroup)."""

    def open_weight_channel(self, transport: str, receivers: list[str], timeout_s: float,
                            join: Callable[[str, dict[str, str] | None], None]) -> str:
        """Host a new channel to ``receivers``; call ``join(address, by_gpu)`` while the senders
        wait for them; return the (first) sender's address."""

    def push_weights(self, bucket_bytes: int, per_gpu: bool = False) -> Iterator[Any]:
        """Stream the weights: one payload (or a handle the engines resolve to one) per bucket."""

    def weight_sync_stats(self) -> dict[str, Any]:
        """What the sender measured in the last sync (SyncStats as a dict)."""


class Sink(Protocol):
    """The engine side of a sync: every engine's workers (megatron_pc.rollout.group.EngineGroup)."""

    engines: list[Any]
    """The engines, compared by identity: a replaced engine needs a new channel."""

    @property
    def weight_receivers(self) -> list[str]:
        """Every engine worker's receive end, in rank order."""

    def join_weight_channel(self, transport: str, address: str, timeout_s: float, by_gpu: dict[str, str] | None = None) -> None:
        """Every engine worker joins the channel at ``address`` (per GPU: ``by_gpu``)."""

    def update_weights(self, weights: Any) -> Sequence[Any]:
        """Every engine loads one bucket's payload; per engine, what it received (``.bytes``)."""


@dataclass(frozen=True)
class Channel:
    """The open channel: its transport, the engines it reaches, the senders' addresses."""

    transport: str
    engines: tuple[Any, ...]
    senders: tuple[str, ...]


class WeightSync:
    """The run's weight syncs from ``source`` into ``sink`` over ``transport`` (a resolved
    ``rollout.weight_transport``), in buckets of about ``bucket_mb`` MiB."""

    def __init__(self, source: Source, sink: Sink, bucket_mb: int, transport: str) -> None:
        self.source, self.sink, self.bucket_mb, self.transport = source, sink, bucket_mb, transport
        self.channel: Channel | None = None
        """The open channel, if any."""
        self.opened = 0
        """Channels opened so far."""

    def sync_weights(self) -> dict[str, float]:
        """Stream the policy's weights (HF names, full tensors) into every engine, bucket by bucket.

        The engines load bucket k while rank 0 gathers bucket k+1; rank 0's sender puts bucket
        k+2 only after every engine worker acknowledged bucket k. Returns seconds and MB moved,
        and what the sender measured in flight.
        """
        per_gpu = get_transport(self.transport).sender.per_gpu  # an unknown name fails here, naming the choices
        start = time.perf_counter()
        self._connect()
        moved = 0
        try:
            for payload in self.source.push_weights(self.bucket_mb * 2**20, per_gpu=per_gpu):
                moved += self.sink.update_weights(payload)[0].bytes  # an engine that died raises its EngineError
        except Exception:
            abort(self.channel.senders if self.channel is not None else ())
            self.channel = None
            raise
        seconds = time.perf_counter() - start
        sent = self.source.weight_sync_stats()
        return {
            "sync_seconds": seconds, "sync_mb": moved / 1e6, "sync_mb_per_s": moved / 1e6 / seconds if seconds else 0.0,
            "sync_buckets": sent["buckets"], "sync_bucket_mb_max": sent["max_bucket_bytes"] / 1e6,
            "sync_inflight_buckets_max": sent["max_in_flight_buckets"], "sync_inflight_mb_max": sent["max_in_flight_bytes"] / 1e6,
        }  # fmt: skip

    def _connect(self) -> None:
        """Open a channel to the current engines' workers, unless it is open already (a
        restarted engine is a new actor: then everyone joins a new channel)."""
        engines = tuple(self.sink.engines)  # engines compare by identity
        if self.channel is not None and (self.channel.transport, self.channel.engines) == (self.transport, engines):
            return
        receivers = self.sink.weight_receivers
        opened: list[str] = []

        def join(address: str, by_gpu: dict[str, str] | None) -> None:
            opened.extend(by_gpu.values() if by_gpu else [address])
            try:
                self.sink.join_weight_channel(self.transport, address, DEFAULT_TIMEOUT_S, by_gpu)
            except Exception:
                abort(opened)  # the ranks wait for the joins in connect_weight_channel: free them now
                raise

        address = self.source.open_weight_channel(self.transport, receivers, DEFAULT_TIMEOUT_S, join=join)
        self.channel = Channel(self.transport, engines, tuple(opened))
        self.opened += 1
        logger.info("weight sync: %s channel at %s to %s", self.transport, address, ", ".join(receivers))


def abort(addresses: Sequence[str]) -> None:
    """An engine failed joining or mid-sync: stop the senders at ``addresses`` from waiting for
    joins or acknowledgements that will never come (they finish their gathers and end), so the
    policy ranks are free for the next sync on a new channel."""
    for address in addresses:
        try:
            Rendezvous.join(address, timeout_s=30.0).abort()
        except TransportError:
            logger.warning("weight sync: could not abort the channel at %s", address, exc_info=True)
