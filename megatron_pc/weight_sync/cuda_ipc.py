"""The ``cuda_ipc`` channel: colocated, a policy rank packs each bucket on its GPU and hands the
engine workers that see that GPU a CUDA IPC handle of it; it frees a buffer only after every
receiver acknowledged it, and keeps at most :data:`IPC_WINDOW` alive."""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from megatron_pc.weight_sync.buckets import Bucket, TransportError, bucket_meta, describe, pack, unpack
from megatron_pc.weight_sync.channel import BucketPayload, Receiver, Sender
from megatron_pc.weight_sync.rendezvous import Rendezvous

logger = logging.getLogger(__name__)

IPC_WINDOW = 2
"""Buckets a CUDA IPC sender keeps shared at once: the engine loads bucket k while the
policy gathers bucket k+1; memory stays near two buckets."""


@dataclass
class SharedBucket(BucketPayload):
    """A bucket packed in the sender's GPU memory: what an engine worker needs to map and load it."""

    handle: tuple[Any, tuple[Any, ...]]
    """``reduce_tensor(buffer)``: a rebuild function and its arguments."""
    device_uuid: str
    """UUID of the sender's GPU: device indices differ between processes (CUDA_VISIBLE_DEVICES)."""


@dataclass
class PerGpuBucket(BucketPayload):
    """Bucket ``index`` as every policy rank shared it on its own GPU: each engine worker loads
    the one on its GPU (the same tensors everywhere: each rank gathered them in its TP group)."""

    shared: list[SharedBucket]

    @classmethod
    def of(cls, shared: list[SharedBucket]) -> "PerGpuBucket":
        """The per-rank payloads of one bucket, checked to be the same bucket."""
        first = shared[0]
        for other in shared[1:]:
            if (other.index, other.meta) != (first.index, first.meta):
                raise TransportError(f"policy ranks shared different weight buckets at once: bucket {first.index} ({describe(first.meta)}) "
                                     f"and bucket {other.index} ({describe(other.meta)})")
        return cls(first.sync, first.index, first.meta, list(shared))

    def on(self, uuid: str, who: str) -> SharedBucket:
        """The copy on the GPU with ``uuid``."""
        for shared in self.shared:
            if shared.device_uuid == uuid:
                return shared
        raise TransportError(f"{who}: no policy rank shared weight bucket {self.index} on this worker's GPU {uuid} "
                             f"(shared on {', '.join(s.device_uuid for s in self.shared)}): cuda_ipc needs every engine "
                             "worker on a policy rank's GPU (cluster.placement=colocated)")


_DEVICE_ARG = 6
"""Position of the device index in ``rebuild_cuda_tensor``'s arguments (torch 2.x)."""


def _device_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


def _local_index(uuid: str, who: str) -> int:
    """This process's index of the GPU with ``uuid``."""
    for index in range(torch.cuda.device_count()):
        if _device_uuid(index) == uuid:
            return index
    raise TransportError(f"{who}: the sender's GPU {uuid} is not visible in this process: cuda_ipc needs the engine on the policy's GPU")


def this_gpu() -> str:
    """The UUID of this process's current GPU."""
    return _device_uuid(torch.cuda.current_device())


class IpcSender(Sender):
    """A policy rank's end of a CUDA IPC channel to the engine worker(s) that see its GPU.

    In a run every policy rank holds one (``per_gpu``): its receiver is the engine worker on
    its own GPU, and it shares the full tensors its TP group gathered."""

    transport = "cuda_ipc"
    per_gpu = True

    def __init__(self, rendezvous: Rendezvous, receivers: Sequence[str], device: torch.device | str = "cuda", window: int = IPC_WINDOW) -> None:
        super().__init__(rendezvous, receivers, device, window)

    def _send(self, index: int, bucket: Bucket) -> Iterator[BucketPayload]:
        from torch.multiprocessing.reductions import reduce_tensor

        device = torch.device("cuda", torch.cuda.current_device())
        meta = bucket_meta(bucket)
        # Admitted (older buckets acknowledged) before packing: GPU memory stays near the window.
        self.window.admit(BucketPayload(self.sync, index, meta))
        _, buffer = pack(bucket, device)
        self.window.keep(buffer)  # freed only after every receiver acknowledged it
        torch.cuda.current_stream().synchronize()  # the copies are done before another process reads
        yield SharedBucket(self.sync, index, meta, reduce_tensor(buffer), _device_uuid(device.index))

    def _finished(self) -> None:
        torch.cuda.ipc_collect()

    def close(self) -> None:
        """Forget unacknowledged buffers (a receiver may still map them: torch keeps such
        blocks until their IPC reference count drops)."""
        self.window.reset()


class IpcReceiver(Receiver):
    """An engine worker that sees the sender's GPU."""

    transport = "cuda_ipc"

    def __init__(self, rendezvous: Rendezvous, rank: int, size: int, name: str, device: torch.device | str = "cuda") -> None:
        super().__init__(rendezvous, rank, size, name, device)
        self.announce()

    def receive(self, payload: BucketPayload) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) pairs viewing the sender's buffer; call :meth:`done` once they are
        loaded and no longer referenced."""
        if isinstance(payload, PerGpuBucket):
            payload = payload.on(this_gpu(), self.name)
        shared: SharedBucket = self._check(payload, SharedBucket)
        rebuild, args = shared.handle
        args = list(args)
        args[_DEVICE_ARG] = _local_index(shared.device_uuid, self.name)
        try:
            buffer = rebuild(*args)
        except Exception as err:
            raise TransportError(f"{self.name}: mapping weight bucket {shared.index} ({describe(shared.meta)}) failed: {err}") from err
        return unpack(shared.meta, buffer)

    def done(self, payload: BucketPayload) -> None:
        """Tell the sender the bucket is loaded (after the copies finished)."""
        if isinstance(payload, PerGpuBucket):
            payload = payload.on(this_gpu(), self.name)  # acknowledged as its own sender counts it
        torch.cuda.synchronize()
        super().done(payload)
