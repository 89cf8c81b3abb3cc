"""The ``object_store`` channel: each bucket's CPU tensors travel inside its payload, which Ray's
object store carries from policy rank 0 to every engine; the engine's workers acknowledge each
bucket through the channel's store so that at most :data:`~.channel.WINDOW` are in flight."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from megatron_pc.weight_sync.buckets import Bucket, bucket_meta
from megatron_pc.weight_sync.channel import BucketPayload, Receiver, Sender
from megatron_pc.weight_sync.rendezvous import Rendezvous


@dataclass
class StoredBucket(BucketPayload):
    """A bucket with its tensors (CPU), in metadata order."""

    tensors: list[torch.Tensor]


def owned_copy(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor`` on the CPU in storage of its own size. A tensor pickles with its whole storage,
    and a parameter of Megatron's distributed optimizer is a view into the contiguous buffer of all
    parameters: sent as it is, every bucket would carry the whole model."""
    tensor = tensor.detach().cpu().contiguous()
    if tensor.untyped_storage().nbytes() != tensor.nbytes:
        tensor = tensor.clone()
    return tensor


class ObjectStoreSender(Sender):
    """Policy rank 0: yields buckets as payloads, at most ``window`` unacknowledged at once."""

    transport = "object_store"
    on_cpu = True

    def _send(self, index: int, bucket: Bucket) -> Iterator[BucketPayload]:
        payload = StoredBucket(self.sync, index, bucket_meta(bucket), [owned_copy(t) for _, t in bucket])
        self.window.admit(payload)  # waits for bucket index - window to be acknowledged
        yield payload  # the streaming generator puts it into the object store here


class ObjectStoreReceiver(Receiver):
    """An engine worker: the payload already holds the tensors."""

    transport = "object_store"

    def __init__(self, rendezvous: Rendezvous, rank: int, size: int, name: str, device: torch.device | str = "cpu") -> None:
        super().__init__(rendezvous, rank, size, name, device)
        self.announce()

    def receive(self, payload: BucketPayload) -> list[tuple[str, torch.Tensor]]:
        stored: StoredBucket = self._check(payload, StoredBucket)
        return [(m.name, t) for m, t in zip(stored.meta, stored.tensors)]
