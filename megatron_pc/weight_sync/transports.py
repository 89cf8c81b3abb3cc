"""The weight-sync transports, one type each, registered by exact name (``rollout.weight_transport``).

    object_store  the bucket's CPU tensors travel in the payload, through Ray's object store
                  (weight_sync.object_store); at most two buckets unacknowledged
    broadcast     the payload is the metadata; the tensors go over a process group of policy
                  rank 0 and every engine worker (weight_sync.broadcast)
    cuda_ipc      the payload is a CUDA IPC handle of the packed bucket on the shared GPU
                  (weight_sync.cuda_ipc)

A transport is its two classes: the sender a policy rank holds and the receiver each engine
worker holds. Every transport has a channel (a store the sender hosts, where receivers announce
themselves and acknowledge buckets).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from megatron_pc.weight_sync.broadcast import BroadcastReceiver, BroadcastSender
from megatron_pc.weight_sync.buckets import DEFAULT_TIMEOUT_S, TransportError
from megatron_pc.weight_sync.channel import Receiver, Sender
from megatron_pc.weight_sync.cuda_ipc import IpcReceiver, IpcSender
from megatron_pc.weight_sync.object_store import ObjectStoreReceiver, ObjectStoreSender
from megatron_pc.weight_sync.rendezvous import Rendezvous

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Transport:
    """How buckets go from a policy rank to the engine workers: its sender and receiver types."""

    name: str
    sender: type[Sender]
    receiver: type[Receiver]


TRANSPORTS: dict[str, Transport] = {
    t.name: t
    for t in (
        Transport("object_store", ObjectStoreSender, ObjectStoreReceiver),
        Transport("broadcast", BroadcastSender, BroadcastReceiver),
        Transport("cuda_ipc", IpcSender, IpcReceiver),
    )
}


def get_transport(name: str) -> Transport:
    """The transport registered under exactly ``name``."""
    try:
        return TRANSPORTS[name]
    except KeyError:
        raise TransportError(f"unknown weight transport {name!r}: one of {', '.join(TRANSPORTS)} "
                             "(resolve rollout.weight_transport first)") from None


def open_sender(transport: str, host: str, receivers: Sequence[str], *, device: torch.device | str = "cpu",
                timeout_s: float = DEFAULT_TIMEOUT_S, port: int = 0) -> Sender:
    """A policy rank's end of a channel; hand ``.address`` to the receivers, then call
    ``.connect()`` while they join."""
    kind = get_transport(transport)
    return kind.sender(Rendezvous.host(host, timeout_s, port), receivers, device)


def join_receiver(transport: str, address: str, rank: int, size: int, name: str, *,
                  device: torch.device | str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> Receiver:
    """An engine worker's end of a channel (for ``broadcast``, blocks until the whole group formed)."""
    kind = get_transport(transport)
    start = time.perf_counter()
    receiver = kind.receiver(Rendezvous.join(address, timeout_s), rank, size, name, device)
    logger.info("%s joined the %s weight-sync channel at %s as rank %d of %d in %.2f s", name, transport, address, rank, size, time.perf_counter() - start)
    return receiver
