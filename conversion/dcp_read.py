"""Read single layers of a Megatron torch_dist checkpoint with torch.distributed.checkpoint.

Megatron stacks the layers of a key (``decoder.layers.X``) along a leading axis. Its own
``dist_checkpointing.load`` cannot request one layer in a one-process world (it describes
the other layers' shards as living on rank ``(rank + 1) % world_size``, i.e. on itself), so
we plan the reads of the wanted chunk directly: the same files, metadata and resharding
algorithm (``create_read_items_for_chunk_list``), no process group needed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from megatron_pc.errors import ConversionError


@dataclass(frozen=True)
class TensorInfo:
    """A stored tensor's global shape and dtype."""

    shape: tuple[int, ...]
    dtype: torch.dtype


def read_metadata(ckpt: Path) -> dict[str, TensorInfo]:
    """The tensors of a torch_dist checkpoint, by key."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    config = ckpt / "metadata.json"
    if not config.is_file() or not (ckpt / ".metadata").is_file():
        raise ConversionError(f"{ckpt}: not a Megatron distributed checkpoint (no metadata.json / .metadata)")
    backend = json.loads(config.read_text()).get("sharded_backend")
    if backend != "torch_dist":
        raise ConversionError(f"{config}: sharded_backend {backend!r} is not supported (only torch_dist)")
    try:
        metadata = FileSystemReader(str(ckpt)).read_metadata()
    except Exception as err:
        raise ConversionError(f"{ckpt / '.metadata'}: unreadable: {err}") from None
    return {key: TensorInfo(tuple(md.size), md.properties.dtype)
            for key, md in metadata.state_dict_metadata.items() if isinstance(md, TensorStorageMetadata)}


def _planner(requests: dict[str, tuple[torch.Tensor, tuple[int, ...]]]) -> Any:
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata
    from torch.distributed.checkpoint.planner import LoadPlan, LoadPlanner
    from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

    class ChunkPlanner(LoadPlanner):
        """Reads each requested chunk (destination tensor, global offsets) in place."""

        def set_up_planner(self, state_dict: dict, metadata: Any = None, is_coordinator: bool = False) -> None:
            self.metadata = metadata

        def create_local_plan(self) -> LoadPlan:
            items = []
            for key, (dest, offsets) in requests.items():
                chunk = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=dest.shape)
                items += create_read_items_for_chunk_list(key, self.metadata.state_dict_metadata[key], [chunk])
            return LoadPlan(items)

        def create_global_plan(self, global_plan: list) -> list:
            return global_plan

        def finish_plan(self, new_plan: LoadPlan) -> LoadPlan:
            return new_plan

        def load_bytes(self, read_item: Any, value: Any) -> None:
            raise ConversionError(f"unexpected non-tensor item {read_item.dest_index.fqn!r} requested")

        def resolve_tensor(self, read_item: Any) -> torch.Tensor:
            dest = requests[read_item.dest_index.fqn][0]
            for dim, (start, length) in enumerate(zip(read_item.dest_offsets, read_item.lengths)):
                dest = dest.narrow(dim, start, length)
            return dest

        def commit_tensor(self, read_item: Any, tensor: torch.Tensor) -> None:
            pass  # resolve_tensor handed out a view of the destination: the data is in place

    return ChunkPlanner()


def read_chunks(ckpt: Path, requests: dict[str, tuple[torch.Tensor, tuple[int, ...]]]) -> None:
    """Fill each destination tensor with the stored chunk at the given global offsets
    (``requests``: key -> (destination, offsets); the destination's shape is the chunk's)."""
    import warnings

    from torch.distributed.checkpoint import FileSystemReader, load

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "assuming the intent is to load in a single process"
        load({}, storage_reader=FileSystemReader(str(ckpt)), planner=_planner(requests), no_dist=True)
