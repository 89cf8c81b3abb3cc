"""The weight-sync transports, one type each, registered by exact name (``rollout.weight_transport``).

    object_store  the bucket itself travels through Ray's object store (CPU tensors)
    broadcast     its metadata travels through Ray; the tensors over a process group of
                  policy rank 0 and the engine actors (weight_sync.broadcast)
    cuda_ipc      a CUDA IPC handle of the packed bucket on the shared GPU (weight_sync.cuda_ipc)

A transport names policy rank 0's streaming method (what it yields per bucket) and the engine
actor's method that loads what was yielded; a transport with a channel also opens its two ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import ClassVar

import torch

from megatron_pc.weight_sync.broadcast import BroadcastReceiver, BroadcastSender
from megatron_pc.weight_sync.buckets import DEFAULT_TIMEOUT_S, TransportError
from megatron_pc.weight_sync.cuda_ipc import IpcReceiver, IpcSender
from megatron_pc.weight_sync.rendezvous import Rendezvous

logger = logging.getLogger(__name__)

Sender = BroadcastSender | IpcSender
Receiver = BroadcastReceiver | IpcReceiver


class Transport:
    """How buckets go from policy rank 0 to the engine actors."""

    name: ClassVar[str]
    send_method: ClassVar[str]
    """MegatronRank's streaming method: what it yields per bucket."""
    load_method: ClassVar[str]
    """EngineActor's method that takes what was yielded and loads the bucket."""
    has_channel: ClassVar[bool] = False

    def open_sender(self, host: str, receivers: Sequence[str], device: torch.device | str, timeout_s: float, port: int) -> Sender:
        """Policy rank 0's end of the channel."""
        raise TransportError(f"the {self.name} transport has no channel to open")

    def join_receiver(self, rendezvous: Rendezvous, rank: int, size: int, name: str, device: torch.device | str) -> Receiver:
        """An engine's end of the channel."""
        raise TransportError(f"the {self.name} transport has no channel to join")


class ObjectStoreTransport(Transport):
    name = "object_store"
    send_method, load_method = "export_buckets", "update_weights"


class BroadcastTransport(Transport):
    name = "broadcast"
    send_method, load_method = "broadcast_buckets", "receive_bucket"
    has_channel = True

    def open_sender(self, host: str, receivers: Sequence[str], device: torch.device | str, timeout_s: float, port: int) -> Sender:
        return BroadcastSender(Rendezvous.host(host, timeout_s, port), receivers, device)

    def join_receiver(self, rendezvous: Rendezvous, rank: int, size: int, name: str, device: torch.device | str) -> Receiver:
        return BroadcastReceiver(rendezvous, rank, size, name, device)


class CudaIpcTransport(Transport):
    name = "cuda_ipc"
    send_method, load_method = "share_buckets", "load_shared_bucket"
    has_channel = True

    def open_sender(self, host: str, receivers: Sequence[str], device: torch.device | str, timeout_s: float, port: int) -> Sender:
        return IpcSender(Rendezvous.host(host, timeout_s, port), receivers)

    def join_receiver(self, rendezvous: Rendezvous, rank: int, size: int, name: str, device: torch.device | str) -> Receiver:
        return IpcReceiver(rendezvous, rank, name)


TRANSPORTS: dict[str, Transport] = {t.name: t for t in (ObjectStoreTransport(), BroadcastTransport(), CudaIpcTransport())}


def get_transport(name: str) -> Transport:
    """The transport registered under exactly ``name``."""
    try:
        return TRANSPORTS[name]
    except KeyError:
        raise TransportError(f"unknown weight transport {name!r}: one of {', '.join(TRANSPORTS)} "
                             "(resolve rollout.weight_transport first)") from None


def open_sender(transport: str, host: str, receivers: Sequence[str], *, device: torch.device | str = "cpu",
                timeout_s: float = DEFAULT_TIMEOUT_S, port: int = 0) -> Sender:
    """Policy rank 0's end of a ``broadcast`` or ``cuda_ipc`` channel; hand ``.address`` to
    the receivers, then call ``.connect()`` while they join."""
    return get_transport(transport).open_sender(host, receivers, device, timeout_s, port)


def join_receiver(transport: str, address: str, rank: int, size: int, name: str, *,
                  device: torch.device | str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> Receiver:
    """An engine's end of a channel (blocks until the whole broadcast group formed)."""
    kind = get_transport(transport)
    if not kind.has_channel:
        raise TransportError(f"no channel for transport {transport!r} (broadcast or cuda_ipc)")
    start = time.perf_counter()
    receiver = kind.join_receiver(Rendezvous.join(address, timeout_s), rank, size, name, device)
    logger.info("%s joined the %s weight-sync channel at %s as rank %d of %d in %.2f s", name, transport, address, rank, size, time.perf_counter() - start)
    return receiver


