"""Safetensors written one tensor at a time: a writer that streams tensors into size-bounded
shards. (The lazy reader is ``megatron_pc/models/safetensors_read.py``: the product checks HF
weights with it too.)"""

from __future__ import annotations

import json
import logging
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import torch

from megatron_pc.errors import ConversionError
from megatron_pc.models.safetensors_read import INDEX

logger = logging.getLogger(__name__)

_DTYPE_CODES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.float64: "F64"}


@dataclass(frozen=True)
class Planned:
    """A tensor the writer will receive: name, shape, dtype."""

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        """Its size on disk."""
        numel = 1
        for dim in self.shape:
            numel *= dim
        return numel * torch.empty((), dtype=self.dtype).element_size()


def plan_shards(plan: list[Planned], max_shard_bytes: int) -> list[list[Planned]]:
    """Consecutive tensors packed into shards of at most ``max_shard_bytes`` (a larger tensor
    gets a shard of its own)."""
    shards: list[list[Planned]] = [[]]
    size = 0
    for item in plan:
        if shards[-1] and size + item.nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(item)
        size += item.nbytes
    return shards


def _header(tensors: list[Planned]) -> bytes:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in tensors:
        header[t.name] = {"dtype": _DTYPE_CODES[t.dtype], "shape": list(t.shape),
                          "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-byte aligned
    return struct.pack("<Q", len(raw)) + raw


class ShardedWriter:
    """Writes planned tensors, in plan order, into safetensors shards under ``out_dir``.

    The shard headers are written from the plan, so each tensor goes to disk as it arrives
    and only one tensor is held at a time. More than one shard: ``model-0000i-of-0000n``
    files and ``model.safetensors.index.json``; one shard: ``model.safetensors``."""

    def __init__(self, out_dir: Path, plan: list[Planned], max_shard_bytes: int) -> None:
        for t in plan:
            if t.dtype not in _DTYPE_CODES:
                raise ConversionError(f"tensor {t.name!r}: dtype {t.dtype} cannot be written")
        self.out_dir = Path(out_dir)
        self.shards = plan_shards(plan, max_shard_bytes)
        n = len(self.shards)
        self.files = (["model.safetensors"] if n == 1
                      else [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)])
        self._queue = [(s, t) for s, shard in enumerate(self.shards) for t in shard]
        self._next = 0
        self._stream: BinaryIO | None = None

    def write(self, name: str, tensor: torch.Tensor) -> None:
        """Append the next planned tensor."""
        if self._next >= len(self._queue):
            raise ConversionError(f"tensor {name!r} was not planned (all {len(self._queue)} are written)")
        shard, planned = self._queue[self._next]
        if (name, tuple(tensor.shape), tensor.dtype) != (planned.name, planned.shape, planned.dtype):
            raise ConversionError(f"expected tensor {planned.name!r} {planned.shape} {planned.dtype}, got "
                                  f"{name!r} {tuple(tensor.shape)} {tensor.dtype}")
        if planned is self.shards[shard][0]:
            self._close_stream()
            self._stream = open(self.out_dir / self.files[shard], "wb")  # noqa: SIM115 - spans calls
            self._stream.write(_header(self.shards[shard]))
        data = tensor.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        assert self._stream is not None
        self._stream.write(data.numpy().tobytes())
        self._next += 1

    def _close_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def close(self) -> None:
        """Finish the last shard and write the index (when sharded); every tensor must be in."""
        self._close_stream()
        if self._next != len(self._queue):
            raise ConversionError(f"only {self._next} of {len(self._queue)} planned tensors were written; "
                                  f"next missing: {self._queue[self._next][1].name!r}")
        if len(self.files) > 1:
            weight_map = {t.name: file for file, shard in zip(self.files, self.shards) for t in shard}
            total = sum(t.nbytes for shard in self.shards for t in shard)
            index = {"metadata": {"total_size": total}, "weight_map": weight_map}
            (self.out_dir / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        logger.info("wrote %d safetensors file(s) to %s", len(self.files), self.out_dir)


def parse_size(text: str) -> int:
    """Bytes in ``5GB``, ``500MB``, ``2GiB`` or a plain integer."""
    units = {"KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9, "B": 1}
    upper = text.strip().upper()
    for unit, factor in units.items():
        if upper.endswith(unit) and upper[: -len(unit)].strip().replace(".", "", 1).isdigit():
            return int(float(upper[: -len(unit)]) * factor)
    if upper.isdigit():
        return int(upper)
    raise ConversionError(f"--max-shard-size: cannot read {text!r} (e.g. 5GB, 500MB, 2GiB)")
