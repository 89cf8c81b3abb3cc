"""The ``broadcast`` channel: policy rank 0 and the engine actors form a process group of their
own (gloo on CPU, NCCL on GPU) and each packed bucket is broadcast from rank 0."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from megatron_pc.weight_sync.buckets import Bucket, TensorMeta, TransportError, describe, layout, pack, unpack
from megatron_pc.weight_sync.rendezvous import Rendezvous, _td

logger = logging.getLogger(__name__)


def _new_group(store: dist.Store, rank: int, size: int, device: torch.device, timeout_s: float) -> Any:
    """A process group of its own (never the default one): gloo for CPU tensors, NCCL for CUDA."""
    prefixed = dist.PrefixStore("weight_sync_group", store)
    if device.type == "cuda":
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        options = dist.ProcessGroupNCCL.Options()
        # Our wait(timeout) fails first and aborts the communicator; the watchdog, which may
        # take the whole process down on its own timeout, gets a later one.
        options._timeout = _td(2 * timeout_s)
        group = dist.ProcessGroupNCCL(prefixed, rank, size, options)
        group.eager_connect_single_device(device)  # connect now: errors surface at join time
        return group
    return dist.ProcessGroupGloo(prefixed, rank, size, _td(timeout_s))


def _broadcast(group: Any, buffer: torch.Tensor, timeout_s: float) -> None:
    options = dist.BroadcastOptions()
    options.rootRank = 0
    options.rootTensor = 0
    # With a timeout, wait() blocks the host for NCCL too, and raises when it expires.
    group.broadcast([buffer], options).wait(_td(timeout_s))


class BroadcastSender:
    """Rank 0 of a broadcast channel: policy rank 0, sending buckets to every engine."""

    def __init__(self, rendezvous: Rendezvous, receivers: Sequence[str], device: torch.device | str = "cpu") -> None:
        self.rendezvous = rendezvous
        self.receivers = list(receivers)
        self.device = torch.device(device)
        self.group: Any = None
        self.sent = 0

    @property
    def address(self) -> str:
        """Where receivers join (``host:port`` of the store)."""
        return self.rendezvous.address

    def connect(self) -> None:
        """Wait for every receiver to announce itself, then form the group (blocks until all
        receivers build it too)."""
        self.rendezvous.await_receivers(self.receivers)
        try:
            self.group = _new_group(self.rendezvous.store, 0, len(self.receivers) + 1, self.device, self.rendezvous.timeout_s)
        except Exception as err:
            raise TransportError(f"forming the weight-sync group with {', '.join(self.receivers)} failed: {err}") from err

    def send(self, bucket: Bucket) -> list[TensorMeta]:
        """Broadcast one bucket (the receivers must call :meth:`BroadcastReceiver.receive`
        with its metadata); returns that metadata."""
        if self.group is None:
            raise TransportError("the weight-sync group is not connected: call connect() first")
        meta, buffer = pack(bucket, self.device)
        try:
            _broadcast(self.group, buffer, self.rendezvous.timeout_s)
        except Exception as err:
            self.close(abort=True)
            raise TransportError(
                f"broadcast of weight bucket {self.sent} ({describe(meta)}) to {', '.join(self.receivers)} failed "
                f"(a receiver died or stopped receiving?): {err}"
            ) from err
        self.sent += 1
        return meta

    def close(self, abort: bool = False) -> None:
        """Drop the group (its peers' next collective fails); ``abort`` after a failure."""
        _shutdown(self.group, abort)
        self.group = None


class BroadcastReceiver:
    """Rank ``rank`` >= 1 of a broadcast channel: an engine actor."""

    def __init__(self, rendezvous: Rendezvous, rank: int, size: int, name: str, device: torch.device | str = "cpu") -> None:
        if not 1 <= rank < size:
            raise TransportError(f"{name}: receiver rank must lie in [1, {size - 1}], got {rank}")
        self.rendezvous = rendezvous
        self.name = name
        self.device = torch.device(device)
        rendezvous.announce(rank, name)
        try:
            self.group = _new_group(rendezvous.store, rank, size, self.device, rendezvous.timeout_s)
        except Exception as err:
            raise TransportError(f"{name}: joining the weight-sync group at {rendezvous.address} failed: {err}") from err
        self.received = 0

    def receive(self, meta: Sequence[TensorMeta]) -> list[tuple[str, torch.Tensor]]:
        """The next bucket, laid out as ``meta`` says: (name, tensor) pairs in order."""
        buffer = torch.empty(layout(meta)[1], dtype=torch.uint8, device=self.device)
        try:
            _broadcast(self.group, buffer, self.rendezvous.timeout_s)
        except Exception as err:
            self.close(abort=True)
            raise TransportError(f"{self.name}: receiving weight bucket {self.received} ({describe(meta)}) failed: {err}") from err
        self.received += 1
        return unpack(meta, buffer)

    def close(self, abort: bool = False) -> None:
        """Drop the group; ``abort`` after a failure."""
        _shutdown(self.group, abort)
        self.group = None


def _shutdown(group: Any, abort: bool = False) -> None:
    if group is None:
        return
    try:
        if abort:
            group.abort()
        else:
            group.shutdown()
    except Exception:  # a group whose peers are gone may fail to shut down cleanly
        logger.debug("weight-sync group shutdown failed", exc_info=True)
