"""The ``cuda_ipc`` channel: colocated on one GPU, rank 0 hands the engine a CUDA IPC handle of
each packed bucket and frees it only after the engine's acknowledgement."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from megatron_pc.weight_sync.buckets import Bucket, TensorMeta, TransportError, describe, pack, unpack
from megatron_pc.weight_sync.rendezvous import Rendezvous

logger = logging.getLogger(__name__)

IPC_WINDOW = 2
"""Buckets a CUDA IPC sender keeps shared at once: the engine loads bucket k while the
policy gathers bucket k+1; memory stays near two buckets."""


@dataclass
class SharedBucket:
    """A bucket packed in the sender's GPU memory: what the engine needs to map and load it."""

    sync: int
    index: int
    meta: list[TensorMeta]
    handle: tuple[Any, tuple[Any, ...]]
    """``reduce_tensor(buffer)``: a rebuild function and its arguments."""
    device_uuid: str
    """UUID of the sender's GPU: device indices differ between processes (CUDA_VISIBLE_DEVICES)."""


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


class IpcSender:
    """Policy rank 0's end of a CUDA IPC channel to the engine(s) on its GPU."""

    def __init__(self, rendezvous: Rendezvous, receivers: Sequence[str], window: int = IPC_WINDOW) -> None:
        self.rendezvous = rendezvous
        self.receivers = list(receivers)
        self.window = window
        self.sync = 0
        self._index = 0
        self._alive: deque[tuple[int, torch.Tensor, str]] = deque()  # (bucket, buffer, description)

    @property
    def address(self) -> str:
        """Where receivers join."""
        return self.rendezvous.address

    def connect(self) -> None:
        """Wait until every receiver announced itself."""
        self.rendezvous.await_receivers(self.receivers)

    def share(self, bucket: Bucket) -> SharedBucket:
        """Pack a bucket on this GPU and return its handle; first waits for the engines to
        acknowledge older buckets so that at most ``window`` stay alive."""
        from torch.multiprocessing.reductions import reduce_tensor

        while len(self._alive) >= self.window:
            self._release_oldest()
        device = torch.device("cuda", torch.cuda.current_device())
        meta, buffer = pack(bucket, device)
        shared = SharedBucket(self.sync, self._index, meta, reduce_tensor(buffer), _device_uuid(device.index))
        self._alive.append((self._index, buffer, describe(meta)))
        self._index += 1
        return shared

    def finish(self) -> None:
        """Wait for every outstanding acknowledgement, free the buffers; the next buckets
        belong to a new sync."""
        while self._alive:
            self._release_oldest()
        torch.cuda.ipc_collect()
        self.sync += 1
        self._index = 0

    def _release_oldest(self) -> None:
        index, _buffer, what = self._alive[0]
        self.rendezvous.await_acks(self.sync, index, self.receivers, f"weight bucket {index} ({what})")
        self._alive.popleft()

    def close(self) -> None:
        """Forget unacknowledged buffers (a receiver may still map them: torch keeps such
        blocks until their IPC reference count drops)."""
        self._alive.clear()


class IpcReceiver:
    """An engine actor on the sender's GPU."""

    def __init__(self, rendezvous: Rendezvous, rank: int, name: str) -> None:
        self.rendezvous = rendezvous
        self.rank = rank
        self.name = name
        rendezvous.announce(rank, name)

    def open(self, shared: SharedBucket) -> list[tuple[str, torch.Tensor]]:
        """(name, tensor) pairs viewing the sender's buffer; call :meth:`acknowledge` once
        they are loaded and no longer referenced."""
        rebuild, args = shared.handle
        args = list(args)
        args[_DEVICE_ARG] = _local_index(shared.device_uuid, self.name)
        try:
            buffer = rebuild(*args)
        except Exception as err:
            raise TransportError(f"{self.name}: mapping weight bucket {shared.index} ({describe(shared.meta)}) failed: {err}") from err
        return unpack(shared.meta, buffer)

    def acknowledge(self, shared: SharedBucket) -> None:
        """Tell the sender the bucket is loaded (after the copies finished)."""
        torch.cuda.synchronize()
        self.rendezvous.acknowledge(shared.sync, shared.index, self.rank)

    def close(self) -> None:
        """Nothing to release: mappings go with their tensors."""
