"""The ``broadcast`` channel: policy rank 0 and every engine worker (each vLLM worker of each
engine) form a process group of their own (gloo on CPU, NCCL on GPU) and each packed bucket is
broadcast from rank 0; its metadata travels ahead as the payload."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from megatron_pc.weight_sync.buckets import Bucket, TensorMeta, TransportError, bucket_meta, describe, layout, pack, unpack
from megatron_pc.weight_sync.channel import WINDOW, BucketPayload, Receiver, Sender
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


@dataclass
class BroadcastBucket(BucketPayload):
    """Only the bucket's metadata: the bytes follow over the group."""


class BroadcastSender(Sender):
    """Rank 0 of a broadcast channel: a policy rank, sending buckets to every engine worker."""

    transport = "broadcast"

    def __init__(self, rendezvous: Rendezvous, receivers: Sequence[str], device: torch.device | str = "cpu", window: int = WINDOW) -> None:
        super().__init__(rendezvous, receivers, device, window)
        self.group: Any = None
        self.sent = 0

    def connect(self) -> None:
        """Wait for every receiver to announce itself, then form the group (blocks until all
        receivers build it too)."""
        self.rendezvous.await_receivers(self.receivers)
        try:
            self.group = _new_group(self.rendezvous.store, 0, len(self.receivers) + 1, self.device, self.rendezvous.timeout_s)
        except Exception as err:
            raise TransportError(f"forming the weight-sync group with {', '.join(self.receivers)} failed: {err}") from err

    def _send(self, index: int, bucket: Bucket) -> Iterator[BucketPayload]:
        payload = BroadcastBucket(self.sync, index, bucket_meta(bucket))
        self.window.admit(payload)
        yield payload  # the receivers learn the layout first, then take part in the broadcast
        self.send(bucket)
        self.window.settled()  # the broadcast returned: every receiver holds the bytes

    def send(self, bucket: Bucket) -> list[TensorMeta]:
        """Broadcast one bucket (each receiver must receive a payload with its metadata);
        returns that metadata."""
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


class BroadcastReceiver(Receiver):
    """Rank ``rank`` >= 1 of a broadcast channel: an engine worker."""

    transport = "broadcast"

    def __init__(self, rendezvous: Rendezvous, rank: int, size: int, name: str, device: torch.device | str = "cpu") -> None:
        super().__init__(rendezvous, rank, size, name, device)
        self.announce()
        try:
            self.group = _new_group(rendezvous.store, rank, size, self.device, rendezvous.timeout_s)
        except Exception as err:
            raise TransportError(f"{name}: joining the weight-sync group at {rendezvous.address} failed: {err}") from err
        self.received = 0

    def receive(self, payload: BucketPayload) -> list[tuple[str, torch.Tensor]]:
        """The bucket, laid out as its metadata says: (name, tensor) pairs in order."""
        meta = self._check(payload, BroadcastBucket).meta
        buffer = torch.empty(layout(meta)[1], dtype=torch.uint8, device=self.device)
        try:
            _broadcast(self.group, buffer, self.rendezvous.timeout_s)
        except Exception as err:
            self.close(abort=True)
            raise TransportError(f"{self.name}: receiving weight bucket {self.received} ({describe(meta)}) failed: {err}") from err
        self.received += 1
        return unpack(meta, buffer)

    def done(self, payload: BucketPayload) -> None:
        """Nothing to acknowledge: the next broadcast waits for this receiver anyway."""

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
