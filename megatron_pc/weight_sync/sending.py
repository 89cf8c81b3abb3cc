"""The policy ranks' end of a weight sync: what a rank does to send its weights, as a base class
the rank's actor (megatron_pc.cluster.ranks.MegatronRank) inherits, so that the driver's calls
reach this file directly and nothing forwards them.

Rank 0 hosts the channel and sends (``object_store``, ``broadcast``); with a per-GPU transport
(``cuda_ipc``) every rank hosts a channel of its own to the engine worker on its GPU. Every rank
gathers the full tensors (a collective), whether it sends or not.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import asdict
from typing import Any

import torch

from megatron_pc.weight_sync.buckets import Bucket, buckets_by_layer
from megatron_pc.weight_sync.channel import BucketPayload, Sender


class SendingRank(abc.ABC):
    """A policy rank as the source of a weight sync: opens, connects and closes its sender and
    streams its weights through it (see :mod:`megatron_pc.weight_sync.sync` for the driver's side)."""

    rank: int
    """This rank in the policy's world."""
    sender: Sender | None = None
    """This rank's end of the open channel (rank 0, or every rank per GPU), if any."""

    @abc.abstractmethod
    def weight_tensors(self, every_rank: bool) -> Iterator[tuple[str, torch.Tensor]]:
        """The policy's full tensors by Hugging Face name (a collective over the model-parallel
        ranks): yielded on rank 0, or on every rank with ``every_rank``."""

    def sender_host(self) -> str:
        """The address receivers reach this rank's channel at: its node's IP."""
        import ray

        return ray.util.get_node_ip_address()

    def open_weight_channel(self, transport: str, receivers: list[str], timeout_s: float) -> dict[str, str] | None:
        """Host a new channel (closing any old one): rank 0 to every engine worker in
        ``receivers``, or, for a per-GPU transport (cuda_ipc), every rank to the engine worker
        on its GPU. Returns {"address": where receivers join, "gpu": this GPU's UUID or ""}, or
        None on a rank that does not send."""
        from megatron_pc import platform
        from megatron_pc.weight_sync.transports import get_transport, open_sender

        self.close_weight_channel()
        per_gpu = get_transport(transport).sender.per_gpu
        if self.rank != 0 and not per_gpu:
            return None
        gpu = ""
        if per_gpu:
            from megatron_pc.weight_sync.cuda_ipc import this_gpu

            gpu = this_gpu()
            receivers = [f"the engine worker on GPU {gpu}"]
        device = platform.device() if platform.on_gpu() else "cpu"
        self.sender = open_sender(transport, self.sender_host(), receivers, device=device, timeout_s=timeout_s)
        return {"address": self.sender.address, "gpu": gpu}

    def connect_weight_channel(self) -> None:
        """Wait for the engine workers to join (forms the broadcast group); a rank that does not
        send has nothing to wait for."""
        if self.sender is not None:
            self.sender.connect()

    def close_weight_channel(self) -> None:
        """Drop this rank's channel, if any."""
        if self.sender is not None:
            self.sender.close()
        self.sender = None

    def push_weights(self, bucket_bytes: int) -> Iterator[BucketPayload]:
        """Collective: every rank gathers the HF tensors; a rank with a sender (rank 0, or every
        rank per GPU) streams one payload per bucket of about ``bucket_bytes`` through it (the
        sender waits for acknowledgements to keep at most two buckets in flight); the other
        ranks take part and yield nothing."""
        sender = self.sender
        if sender is None:
            for _ in self._buckets(bucket_bytes, to_cpu=False):
                pass
            return
        yield from sender.stream(self._buckets(bucket_bytes, to_cpu=sender.on_cpu, every_rank=sender.per_gpu))

    def weight_sync_stats(self) -> dict[str, Any]:
        """What this rank's sender measured in the last sync (buckets and bytes in flight)."""
        if self.sender is None:
            raise RuntimeError(f"policy rank {self.rank}: no weight-sync channel is open")
        return asdict(self.sender.stats)

    def _buckets(self, bucket_bytes: int, *, to_cpu: bool, every_rank: bool = False) -> Iterator[Bucket]:
        """The full tensors in buckets of about ``bucket_bytes``, cut at layer boundaries."""
        named = self.weight_tensors(every_rank)
        tensors = ((name, t.detach().cpu().contiguous() if to_cpu else t.detach()) for name, t in named)
        yield from buckets_by_layer(tensors, bucket_bytes)
