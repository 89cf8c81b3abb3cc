"""How weight buckets travel from policy rank 0 to the engine actors (the weight-sync transports).

A bucket is a list of (HF name, full tensor). Three transports move it
(``rollout.weight_transport``; the driver side is :func:`megatron_pc.cluster.groups.sync_weights`):

- ``object_store``: the bucket goes through Ray's object store (CPU tensors). Needs nothing
  from this module.
- ``broadcast``: policy rank 0 (rank 0 of the group) and every engine actor (ranks 1..E)
  form a process group of their own, made directly from a ``TCPStore`` that rank 0 hosts, so
  the default process group that the Megatron ranks (and vLLM) already use is left alone.
  Gloo on CPU, NCCL on GPU. Each bucket is packed into one byte buffer and broadcast; the
  receivers learn its layout from the bucket's metadata (a list of :class:`TensorMeta`),
  which travels separately (through Ray in the driver).
- ``cuda_ipc``: colocated on one GPU, rank 0 packs the bucket on its GPU and hands the
  engine a CUDA IPC handle of the buffer (``torch.multiprocessing.reductions.reduce_tensor``);
  the engine maps the same memory, loads it, and acknowledges through the store. The sender
  keeps at most :data:`IPC_WINDOW` buckets alive and frees one only after its acknowledgement.

Every wait has a timeout: a receiver that never joins or stops receiving makes the sender
fail with a :class:`TransportError` naming the engines, the bucket and its first tensor
instead of hanging.

Known limit: the receivers are the engine *actor* processes, which hold the vLLM model only
when the engine runs in-process (TP=1, VLLM_ENABLE_V1_MULTIPROCESSING=0). Engines with TP>1
would need the receive to happen in vLLM's worker processes (through ``collective_rpc``);
that is not done (see docs/weight_sync.md).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist

from megatron_pc.errors import MegatronPCError

logger = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 600.0
"""How long a sender or receiver waits for its peers (joining, each broadcast, each
acknowledgement) before it gives up with a :class:`TransportError`."""
ALIGN = 256
"""Byte alignment of each tensor inside a packed bucket: a tensor view at any offset must be
valid for its dtype, and CUDA kernels prefer aligned pointers."""
IPC_WINDOW = 2
"""Buckets a CUDA IPC sender keeps shared at once: the engine loads bucket k while the
policy gathers bucket k+1; memory stays near two buckets."""

Bucket = Sequence[tuple[str, torch.Tensor]]


class TransportError(MegatronPCError, RuntimeError):
    """A weight-sync transport failed: a peer missing, a timeout, a malformed bucket."""


class TensorMeta(NamedTuple):
    """What a receiver needs to allocate one tensor of a bucket: (name, shape, dtype)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    """``str(torch.dtype)``, e.g. ``torch.bfloat16`` (plain strings travel through any pickler)."""

    @property
    def torch_dtype(self) -> torch.dtype:
        """The dtype as a torch.dtype."""
        return _parse_dtype(self.dtype, self.name)

    @property
    def nbytes(self) -> int:
        """Bytes of the tensor's data."""
        numel = 1
        for size in self.shape:
            numel *= size
        return numel * self.torch_dtype.itemsize


def _parse_dtype(text: str, name: str) -> torch.dtype:
    dtype = getattr(torch, text.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype):
        raise TransportError(f"tensor {name}: unknown dtype {text!r} in the bucket metadata")
    return dtype


# ---- bucket layout ------------------------------------------------------------------------
def weight_unit(name: str) -> str:
    """The part of the model an HF weight belongs to: its decoder layer (``model.layers.7``)
    or, outside the layers, its module (``model.embed_tokens``)."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return ".".join(parts[: i + 2])
    return ".".join(parts[:-1])


def buckets_by_layer(named: Iterable[tuple[str, Any]], bucket_bytes: int) -> Iterator[list[tuple[str, Any]]]:
    """Buckets of about ``bucket_bytes`` (HF name, tensor) pairs that never split a decoder layer.

    vLLM reloads each bucket as a whole-model reload: a fused module (qkv_proj, gate_up_proj)
    that received only some of its weights in a call is processed with the rest uninitialised,
    and the engine's log-probs turn to NaN (SmolLM2's 64 MB buckets cut layers in two). So a
    bucket ends only where a new layer begins: it may exceed ``bucket_bytes`` by one layer.
    ``named`` must list each layer's weights together (the Megatron export does).
    """
    bucket: list[tuple[str, Any]] = []
    size = 0
    for name, tensor in named:
        if bucket and size >= bucket_bytes and weight_unit(name) != weight_unit(bucket[-1][0]):
            yield bucket
            bucket, size = [], 0
        bucket.append((name, tensor))
        size += tensor.numel() * tensor.element_size()
    if bucket:
        yield bucket


def bucket_meta(bucket: Bucket) -> list[TensorMeta]:
    """The metadata of a bucket, in bucket order."""
    return [TensorMeta(name, tuple(t.shape), str(t.dtype)) for name, t in bucket]


def layout(meta: Sequence[TensorMeta]) -> tuple[list[int], int]:
    """Byte offset of each tensor in the packed buffer (each aligned to :data:`ALIGN`), and
    the buffer's size. Sender and receivers derive it from the metadata alone."""
    offsets, end = [], 0
    for m in meta:
        start = -(-end // ALIGN) * ALIGN
        offsets.append(start)
        end = start + m.nbytes
    return offsets, end


def pack(bucket: Bucket, device: torch.device | str | None = None) -> tuple[list[TensorMeta], torch.Tensor]:
    """The bucket's metadata and its tensors copied into one uint8 buffer on ``device``
    (default: the first tensor's device). Any dtype, shape or stride packs."""
    meta = bucket_meta(bucket)
    offsets, total = layout(meta)
    if device is None:
        device = bucket[0][1].device if bucket else "cpu"
    buffer = torch.empty(total, dtype=torch.uint8, device=device)
    for (_, tensor), m, offset in zip(bucket, meta, offsets):
        flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
        buffer[offset : offset + m.nbytes].copy_(flat, non_blocking=True)
    return meta, buffer


def unpack(meta: Sequence[TensorMeta], buffer: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs viewing ``buffer``, in metadata order (no copy)."""
    offsets, total = layout(meta)
    if buffer.dtype != torch.uint8 or buffer.numel() != total:
        raise TransportError(f"a bucket of {len(meta)} tensors needs a uint8 buffer of {total} bytes, got {buffer.numel()} x {buffer.dtype}")
    pairs = []
    for m, offset in zip(meta, offsets):
        view = buffer[offset : offset + m.nbytes].view(m.torch_dtype).reshape(m.shape)
        pairs.append((m.name, view))
    return pairs


def describe(meta: Sequence[TensorMeta]) -> str:
    """A short description of a bucket for error messages: size and first/last tensor."""
    if not meta:
        return "an empty bucket"
    mb = layout(meta)[1] / 1e6
    return f"{len(meta)} tensors, {mb:.2f} MB, {meta[0].name} .. {meta[-1].name}"


# ---- rendezvous -----------------------------------------------------------------------------
def _td(seconds: float) -> timedelta:
    return timedelta(seconds=seconds)


class Rendezvous:
    """The key-value store of one channel: hosted by the sender, joined by the receivers.

    Receivers announce themselves (``joined/<rank>``); CUDA IPC receivers acknowledge buckets
    (``ack/<sync>/<bucket>/<rank>``); the broadcast group keeps its own keys under a prefix.
    """

    def __init__(self, store: dist.Store, address: str, timeout_s: float) -> None:
        self.store = store
        self.address = address
        self.timeout_s = timeout_s

    @classmethod
    def host(cls, host: str, timeout_s: float = DEFAULT_TIMEOUT_S, port: int = 0) -> "Rendezvous":
        """A new store listening on ``port`` (0: any free port) of this machine; ``host`` is
        the address receivers use to reach it."""
        store = dist.TCPStore(host, port, None, True, _td(timeout_s), wait_for_workers=False)
        return cls(store, f"{host}:{store.port}", timeout_s)

    @classmethod
    def join(cls, address: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> "Rendezvous":
        """Connect to the store a sender hosts at ``host:port``."""
        host, port = address.rsplit(":", 1)
        try:
            store = dist.TCPStore(host, int(port), None, False, _td(timeout_s))
        except Exception as err:  # DistStoreError / RuntimeError, depending on the failure
            raise TransportError(f"could not reach the weight-sync store at {address} within {timeout_s:.0f} s: {err}") from err
        return cls(store, address, timeout_s)

    def announce(self, rank: int, name: str) -> None:
        """Say that receiver ``rank`` (called ``name``) is here."""
        self.store.set(f"joined/{rank}", name)

    def await_receivers(self, receivers: Sequence[str]) -> None:
        """Wait until every receiver (rank k+1 is ``receivers[k]``) announced itself."""
        keys = [f"joined/{k + 1}" for k in range(len(receivers))]
        self._wait(keys, lambda missing: f"{_names(receivers, missing)} did not join the weight-sync channel at {self.address}")

    def acknowledge(self, sync: int, bucket: int, rank: int) -> None:
        """Receiver ``rank`` is done with a shared bucket."""
        self.store.set(f"ack/{sync}/{bucket}/{rank}", "1")

    def await_acks(self, sync: int, bucket: int, receivers: Sequence[str], what: str) -> None:
        """Wait until every receiver acknowledged a bucket; then forget the keys."""
        keys = [f"ack/{sync}/{bucket}/{k + 1}" for k in range(len(receivers))]
        self._wait(keys, lambda missing: f"{_names(receivers, missing)} did not acknowledge {what}")
        for key in keys:
            self.store.delete_key(key)

    def _wait(self, keys: list[str], message: Callable[[list[int]], str]) -> None:
        try:
            self.store.wait(keys, _td(self.timeout_s))
        except Exception as err:  # the store raises DistStoreError on timeout
            missing = [i for i, key in enumerate(keys) if not self.store.check([key])]
            if not missing:
                raise
            raise TransportError(f"{message(missing)} within {self.timeout_s:.0f} s") from err


def _names(receivers: Sequence[str], indices: Sequence[int]) -> str:
    return ", ".join(f"{receivers[i]} (rank {i + 1})" for i in indices)


# ---- broadcast --------------------------------------------------------------------------------
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


# ---- CUDA IPC -------------------------------------------------------------------------------
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


# ---- one entry point per side -------------------------------------------------------------------
Sender = BroadcastSender | IpcSender
Receiver = BroadcastReceiver | IpcReceiver


def open_sender(transport: str, host: str, receivers: Sequence[str], *, device: torch.device | str = "cpu",
                timeout_s: float = DEFAULT_TIMEOUT_S, port: int = 0) -> Sender:
    """Policy rank 0's end of a ``broadcast`` or ``cuda_ipc`` channel; hand ``.address`` to
    the receivers, then call ``.connect()`` while they join."""
    rendezvous = Rendezvous.host(host, timeout_s, port)
    if transport == "broadcast":
        return BroadcastSender(rendezvous, receivers, device)
    if transport == "cuda_ipc":
        return IpcSender(rendezvous, receivers)
    raise TransportError(f"no channel for transport {transport!r} (broadcast or cuda_ipc)")


def join_receiver(transport: str, address: str, rank: int, size: int, name: str, *,
                  device: torch.device | str = "cpu", timeout_s: float = DEFAULT_TIMEOUT_S) -> Receiver:
    """An engine's end of a channel (blocks until the whole broadcast group formed)."""
    start = time.perf_counter()
    rendezvous = Rendezvous.join(address, timeout_s)
    receiver: Receiver
    if transport == "broadcast":
        receiver = BroadcastReceiver(rendezvous, rank, size, name, device)
    elif transport == "cuda_ipc":
        receiver = IpcReceiver(rendezvous, rank, name)
    else:
        raise TransportError(f"no channel for transport {transport!r} (broadcast or cuda_ipc)")
    logger.info("%s joined the %s weight-sync channel at %s as rank %d of %d in %.2f s", name, transport, address, rank, size, time.perf_counter() - start)
    return receiver
