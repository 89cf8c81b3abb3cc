"""What the two ends of every transport share: the payload that tells an engine worker about one
bucket, the spec a worker joins a channel with, the sender's window of buckets in flight, and
the :class:`Sender` / :class:`Receiver` interfaces each transport implements.

A sync streams buckets: the sender (policy rank 0, or each policy rank for CUDA IPC per GPU)
yields one :class:`BucketPayload` per bucket, the driver hands it to every engine, and the
engine's workers turn it back into (HF name, tensor) pairs with their :class:`Receiver`. A
receiver that acknowledges (object_store, cuda_ipc) lets the sender count the buckets in flight:
the sender admits bucket k+window only after every receiver acknowledged bucket k.
"""

from __future__ import annotations

import abc
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import torch

from megatron_pc.weight_sync.buckets import Bucket, TensorMeta, TransportError, describe, layout
from megatron_pc.weight_sync.rendezvous import Rendezvous, SyncAborted

WINDOW = 2
"""Buckets a sender keeps in flight (handed out, not yet acknowledged by every receiver): the
engines load bucket k while the policy gathers bucket k+1; memory stays near two buckets."""


@dataclass
class BucketPayload:
    """What travels to an engine per bucket (the base of each transport's payload type)."""

    sync: int
    """The sender's sync counter: acknowledgements are keyed by (sync, index)."""
    index: int
    meta: list[TensorMeta]

    @property
    def nbytes(self) -> int:
        """Bytes of the packed bucket."""
        return layout(self.meta)[1]


@dataclass(frozen=True)
class ChannelSpec:
    """How an engine joins a sender's channel: its workers take ranks ``first_rank ..
    first_rank + workers - 1`` of ``size`` (the sender is rank 0).

    Per GPU (``by_gpu``, CUDA IPC): each policy rank hosts a channel of its own, listed by its
    GPU's UUID; a worker joins the one on its GPU as rank 1 of 2."""

    transport: str
    address: str
    first_rank: int
    size: int
    timeout_s: float
    by_gpu: dict[str, str] | None = None

    def for_gpu(self, uuid: str, who: str) -> "ChannelSpec":
        """The spec of the channel on GPU ``uuid`` (this one when not per GPU)."""
        if self.by_gpu is None:
            return self
        if uuid not in self.by_gpu:
            raise TransportError(f"{who}: no policy rank sends weights on this worker's GPU {uuid} (policy ranks are on "
                                 f"{', '.join(self.by_gpu)}): cuda_ipc needs every engine worker on a policy rank's GPU")
        return ChannelSpec(self.transport, self.by_gpu[uuid], 1, 2, self.timeout_s)


def receiver_names(engine: str, workers: int) -> list[str]:
    """The receive ends of an engine with ``workers`` vLLM workers (its tensor parallelism):
    the engine's name, or ``engine0.tp1`` etc. when it has several."""
    return [engine] if workers == 1 else [f"{engine}.tp{r}" for r in range(workers)]


@dataclass
class SyncStats:
    """What a sender measured in its last sync (bytes as the sender counts them at each put
    and acknowledgement)."""

    buckets: int = 0
    bytes: int = 0
    max_bucket_bytes: int = 0
    max_in_flight_buckets: int = 0
    max_in_flight_bytes: int = 0
    history: list[tuple[int, int]] = field(default_factory=list)
    """(buckets, bytes) in flight after each put: the window's trace."""


class Window:
    """Buckets handed out and not yet acknowledged by every receiver, at most ``size``."""

    def __init__(self, rendezvous: Rendezvous, receivers: Sequence[str], size: int = WINDOW) -> None:
        if size < 1:
            raise TransportError(f"a window of buckets in flight must hold >= 1 bucket, got {size}")
        self.rendezvous = rendezvous
        self.receivers = list(receivers)
        self.size = size
        self._alive: deque[tuple[int, int, int, str, Any]] = deque()  # (sync, index, bytes, description, what to keep)
        self.stats = SyncStats()

    def admit(self, payload: BucketPayload, keep: Any = None) -> None:
        """Wait until fewer than ``size`` buckets are in flight, then count ``payload`` as one
        (``keep``: what must stay alive until it is acknowledged, e.g. its GPU buffer)."""
        while len(self._alive) >= self.size:
            self.release_oldest()
        nbytes = payload.nbytes
        self._alive.append((payload.sync, payload.index, nbytes, describe(payload.meta), keep))
        s = self.stats
        s.buckets += 1
        s.bytes += nbytes
        s.max_bucket_bytes = max(s.max_bucket_bytes, nbytes)
        in_flight = sum(entry[2] for entry in self._alive)
        s.max_in_flight_buckets = max(s.max_in_flight_buckets, len(self._alive))
        s.max_in_flight_bytes = max(s.max_in_flight_bytes, in_flight)
        s.history.append((len(self._alive), in_flight))

    def release_oldest(self) -> None:
        """Wait for every receiver's acknowledgement of the oldest bucket in flight; forget it."""
        sync, index, _, what, _ = self._alive[0]
        self.rendezvous.await_acks(sync, index, self.receivers, f"weight bucket {index} ({what})")
        self._alive.popleft()

    def keep(self, obj: Any) -> None:
        """Keep ``obj`` alive until the newest bucket is acknowledged."""
        entry = self._alive[-1]
        self._alive[-1] = (*entry[:4], obj)

    def settled(self) -> None:
        """The newest bucket reached every receiver without acknowledgements (a broadcast
        returns only once every receiver holds the bytes): forget it."""
        self._alive.pop()

    def drain(self) -> None:
        """Wait until every bucket in flight is acknowledged."""
        while self._alive:
            self.release_oldest()

    def reset(self) -> None:
        """Forget the buckets in flight (after a failure) and start new statistics."""
        self._alive.clear()
        self.stats = SyncStats()


class Sender(abc.ABC):
    """A policy rank's end of a channel: streams buckets to every receiver."""

    transport: ClassVar[str]
    on_cpu: ClassVar[bool] = False
    """Whether the buckets it streams must hold CPU tensors."""
    per_gpu: ClassVar[bool] = False
    """Whether every policy rank holds a sender, each feeding the engine worker on its own GPU
    (with full tensors gathered in its TP group); otherwise rank 0 alone sends to every worker."""

    def __init__(self, rendezvous: Rendezvous, receivers: Sequence[str], device: torch.device | str = "cpu", window: int = WINDOW) -> None:
        self.rendezvous = rendezvous
        self.receivers = list(receivers)
        self.device = torch.device(device)
        self.window = Window(rendezvous, receivers, window)
        self.sync = 0

    @property
    def address(self) -> str:
        """Where receivers join (``host:port`` of the store)."""
        return self.rendezvous.address

    def connect(self) -> None:
        """Wait until every receiver announced itself."""
        self.rendezvous.await_receivers(self.receivers)

    @property
    def stats(self) -> SyncStats:
        """What the last (or current) sync measured."""
        return self.window.stats

    def stream(self, buckets: Iterable[Bucket]) -> Iterator[BucketPayload]:
        """One payload per bucket, in order; returns once every receiver is done with all of
        them. The caller must hand each payload to the engines while the stream goes on."""
        self.window.reset()
        it = iter(buckets)
        try:
            for index, bucket in enumerate(it):
                yield from self._send(index, bucket)
            self.window.drain()
            self._finished()
        except SyncAborted:
            self.window.reset()
            for _ in it:  # the other policy ranks are still gathering: take part to the end
                pass
            raise
        finally:
            self.sync += 1

    @abc.abstractmethod
    def _send(self, index: int, bucket: Bucket) -> Iterator[BucketPayload]:
        """Yield bucket ``index``'s payload (after admitting it to the window) and send it."""

    def _finished(self) -> None:
        """After the last acknowledgement of a sync."""

    def close(self) -> None:
        """Drop the channel."""


class Receiver(abc.ABC):
    """An engine worker's end of a channel."""

    transport: ClassVar[str]

    def __init__(self, rendezvous: Rendezvous, rank: int, size: int, name: str, device: torch.device | str = "cpu") -> None:
        if not 1 <= rank < size:
            raise TransportError(f"{name}: receiver rank must lie in [1, {size - 1}], got {rank}")
        self.rendezvous = rendezvous
        self.rank = rank
        self.size = size
        self.name = name
        self.device = torch.device(device)

    def announce(self) -> None:
        """Tell the sender this receiver is here."""
        self.rendezvous.announce(self.rank, self.name)

    @abc.abstractmethod
    def receive(self, payload: BucketPayload) -> list[tuple[str, torch.Tensor]]:
        """The bucket's (name, tensor) pairs, in order."""

    def done(self, payload: BucketPayload) -> None:
        """The bucket is loaded and no longer referenced: acknowledge it."""
        self.rendezvous.acknowledge(payload.sync, payload.index, self.rank)

    def close(self, abort: bool = False) -> None:
        """Leave the channel."""

    def _check(self, payload: BucketPayload, kind: type) -> Any:
        if not isinstance(payload, kind):
            raise TransportError(f"{self.name}: a {self.transport} receiver got a {type(payload).__name__}, not a {kind.__name__}")
        return payload
