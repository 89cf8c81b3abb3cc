"""Weight buckets: what one transfer carries, and how it is packed into one byte buffer.

A bucket is a list of (HF name, full tensor); buckets end at layer boundaries so an engine
never holds half a layer's new weights. Its metadata (a list of :class:`TensorMeta`) tells a
receiver how to cut the packed buffer back into named tensors.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any, NamedTuple

import torch

from megatron_pc.errors import MegatronPCError

DEFAULT_TIMEOUT_S = 600.0
"""How long a sender or receiver waits for its peers (joining, each broadcast, each
acknowledgement) before it gives up with a :class:`TransportError`."""
ALIGN = 256
"""Byte alignment of each tensor inside a packed bucket: a tensor view at any offset must be
valid for its dtype, and CUDA kernels prefer aligned pointers."""

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
