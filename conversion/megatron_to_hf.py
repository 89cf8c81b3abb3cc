"""Megatron-Core distributed checkpoint -> Hugging Face directory.

    python -m conversion.megatron_to_hf --ckpt DIR --out DIR [--hf-config DIR] [--max-shard-size 5GB] [--force]

Reads checkpoints written by the policy worker (``megatron_pc.training.checkpoint``, any
TP/PP/DP) or by ``conversion.hf_to_megatron``. The output is the same whatever layout the
checkpoint was saved with: Megatron stores every tensor by its global shape.

Memory: one layer is loaded at a time (a torch.distributed.checkpoint read of only that
layer's chunk of each key, see conversion/dcp_read.py), converted with the inverse name map and streamed into
safetensors shards whose headers are planned up front, so the peak is about one layer.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from conversion import common
from conversion.command import Command
from conversion.dcp_read import TensorInfo, read_chunks, read_metadata
from conversion.safetensors_io import Planned, ShardedWriter, parse_size
from megatron_pc.errors import ConversionError
from megatron_pc.models import hf_check, name_maps
from megatron_pc.models.hf_config import HFArch

logger = logging.getLogger(__name__)


def _check(items: list[hf_check.Item], meta: dict[str, TensorInfo], arch: HFArch, shapes: name_maps.Shapes,
           ckpt: Path) -> None:
    """Every tensor the config implies is in the checkpoint with the implied global shape."""
    for item in items:
        if item.key not in meta:
            raise ConversionError(f"{ckpt}: tensor {item.key!r} (for {item.name}) is missing from the checkpoint")
        shape = hf_check.full_shape(item, arch, shapes)
        expected = shape if item.layer is None else (arch.num_layers, *shape)
        found = meta[item.key].shape
        if found != expected:
            raise ConversionError(f"{ckpt}: tensor {item.key!r} has shape {found}; the config "
                                  f"implies {expected}")


def _plan(groups: list[list[hf_check.Item]], meta: dict, arch: HFArch, shapes: name_maps.Shapes) -> list[Planned]:
    """The HF tensors the export will produce, in order (from meta tensors: no data)."""
    plan = []
    for group in groups:
        for item in group:
            meta_full = torch.empty(hf_check.full_shape(item, arch, shapes), dtype=meta[item.key].dtype, device="meta")
            for name, tensor in name_maps.hf_tensors(item.entry, item.layer, meta_full, shapes):
                plan.append(Planned(name, tuple(tensor.shape), tensor.dtype))
    return plan


def _load_group(ckpt: Path, group: list[hf_check.Item], meta: dict[str, TensorInfo], arch: HFArch,
                shapes: name_maps.Shapes) -> dict[str, torch.Tensor]:
    """The full Megatron tensors of one group (a layer: its slice of each stacked key)."""
    out, requests = {}, {}
    for item in group:
        shape = hf_check.full_shape(item, arch, shapes)
        out[item.name] = torch.empty(shape, dtype=meta[item.key].dtype)
        if item.layer is None:
            requests[item.key] = (out[item.name], (0,) * len(shape))
        else:
            requests[item.key] = (out[item.name].unsqueeze(0), (item.layer,) + (0,) * len(shape))
    read_chunks(ckpt, requests)
    return out


def iter_checkpoint_hf_tensors(ckpt: Path, arch: HFArch, groups: list[list[hf_check.Item]], meta: dict,
                               shapes: name_maps.Shapes) -> Iterator[tuple[str, torch.Tensor]]:
    """HF-named tensors of the checkpoint, one layer loaded at a time."""
    for group in groups:
        loaded = _load_group(ckpt, group, meta, arch, shapes)
        for item in group:
            yield from name_maps.hf_tensors(item.entry, item.layer, loaded.pop(item.name), shapes)


def convert(ckpt: str | Path, out: str | Path, hf_config: str | Path | None = None,
            max_shard_size: str = "5GB", force: bool = False) -> Path:
    """Export the checkpoint ``ckpt`` as an HF directory ``out``; returns ``out``."""
    ckpt, out = Path(ckpt), Path(out)
    config_dir = Path(hf_config) if hf_config is not None else ckpt
    if not (config_dir / "config.json").is_file():
        raise ConversionError(f"{config_dir / 'config.json'} does not exist; pass --hf-config DIR (the HF "
                              "directory the checkpoint was made from)")
    arch = hf_check.read_arch(config_dir)
    max_bytes = parse_size(max_shard_size)
    start = time.perf_counter()
    meta = read_metadata(ckpt)
    if name_maps.EMBEDDING.megatron not in meta:
        raise ConversionError(f"{ckpt}: tensor {name_maps.EMBEDDING.megatron!r} is missing from the checkpoint")
    shapes = hf_check.shapes_for(arch, meta[name_maps.EMBEDDING.megatron].shape[0])
    groups = list(hf_check.groups(arch))
    _check([item for group in groups for item in group], meta, arch, shapes, ckpt)
    with common.output_dir(out, force) as tmp:
        writer = ShardedWriter(tmp, _plan(groups, meta, arch, shapes), max_bytes)
        for name, tensor in iter_checkpoint_hf_tensors(ckpt, arch, groups, meta, shapes):
            writer.write(name, tensor)
        writer.close()
        common.copy_model_files(config_dir, tmp)
    logger.info("exported %s -> %s in %.1f s", ckpt, out, time.perf_counter() - start)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``megatron-to-hf``."""
    parser.add_argument("--ckpt", required=True, type=Path, help="Megatron checkpoint directory")
    parser.add_argument("--out", required=True, type=Path, help="HF directory to create")
    parser.add_argument("--hf-config", type=Path, default=None,
                        help="directory with config.json and tokenizer files (default: the checkpoint's own)")
    parser.add_argument("--max-shard-size", default="5GB", help="largest safetensors file, e.g. 5GB, 500MB")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")


COMMAND = Command("megatron-to-hf", __doc__.splitlines()[0], add_arguments,
                  lambda args: convert(args.ckpt, args.out, args.hf_config, args.max_shard_size, args.force),
                  "Hugging Face model")
"""The command line (``megatron-pc convert megatron-to-hf``, ``python -m conversion.megatron_to_hf``)."""
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
