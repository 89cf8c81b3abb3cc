"""Hugging Face safetensors -> Megatron-Core distributed checkpoint.

    python -m conversion.hf_to_megatron --hf DIR --out DIR [--tp N] [--pp M] [--dtype D] [--force]

The checkpoint is the model part of what ``megatron_pc.training.checkpoint`` writes (keys
``model.*`` of a torch_dist checkpoint, plus config.json, tokenizer files and the marker),
so ``load_model_only`` / ``megatron-pc score --load`` read it at any TP/PP whose padded
vocabulary equals the one written here: ``--tp`` only fixes that padding (lcm(128, TP)
rows) and checks that TP divides the heads and PP the layers.

Memory: tensors are read lazily and converted one layer at a time; each converted tensor is
written to a staging file and handed to the checkpoint writer memory-mapped, so anonymous
memory peaks near one layer. The mapped pages are file-backed (the kernel can drop them),
but they count in the process RSS while the writer touches them.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

import torch

from conversion import common
from conversion.command import Command
from megatron_pc.errors import ConfigError, ConversionError
from megatron_pc.models import hf_check, name_maps
from megatron_pc.models.hf_config import HFArch, check_parallel_sizes
from megatron_pc.models.provider import padded_vocab_size
from megatron_pc.models.safetensors_read import HFReader

logger = logging.getLogger(__name__)


def _staged(tensor: torch.Tensor, path: Path) -> torch.Tensor:
    """``tensor`` written to ``path`` and mapped back: its own storage, so the checkpoint
    writer neither copies it nor keeps it in anonymous memory."""
    tensor = tensor.contiguous()
    tensor.reshape(-1).view(torch.uint8).numpy().tofile(path)
    mapped = torch.from_file(str(path), shared=True, size=tensor.numel(), dtype=tensor.dtype)
    return mapped.view(tensor.shape)


def _converted(reader: HFReader, item: hf_check.Item, arch: HFArch, shapes: name_maps.Shapes) -> torch.Tensor:
    """The full Megatron tensor of ``item`` from its HF tensors, shapes checked first."""
    meta = torch.empty(hf_check.full_shape(item, arch, shapes), device="meta")
    expected = {n: tuple(t.shape) for n, t in name_maps.hf_tensors(item.entry, item.layer, meta, shapes)}
    parts = [reader.get(name, expected[name]) for name in item.hf_names()]
    dtypes = {p.dtype for p in parts}
    if len(dtypes) > 1:
        raise ConversionError(f"{reader.root}: tensors {item.hf_names()} mix dtypes {sorted(map(str, dtypes))}")
    return name_maps.to_megatron(item.entry, parts, shapes)


def _sharded_state(reader: HFReader, arch: HFArch, shapes: name_maps.Shapes, dtype: torch.dtype | None,
                   staging: Path) -> dict:
    state = {}
    for group in hf_check.groups(arch):
        for item in group:
            full = _converted(reader, item, arch, shapes)
            full = full if dtype is None else full.to(dtype)
            state[item.name] = common.sharded_tensor(item, _staged(full, staging / f"{len(state)}.bin"),
                                                     arch.num_layers)
            del full
    state.update(common.extra_state_objects(arch))
    return state


def convert(hf_dir: str | Path, out: str | Path, tp: int = 1, pp: int = 1, dtype: str = "auto",
            force: bool = False) -> Path:
    """Convert the HF directory ``hf_dir`` into a Megatron checkpoint at ``out``; returns ``out``."""
    from megatron.core import dist_checkpointing

    hf_dir, out = Path(hf_dir), Path(out)
    arch = hf_check.check_hf_weights(hf_dir)  # every tensor there with its shape, and none the config leaves out
    try:
        check_parallel_sizes(arch, tp, pp)
    except ConfigError as err:
        raise ConversionError(f"{hf_dir}: {err}") from None
    shapes = hf_check.shapes_for(arch, padded_vocab_size(arch.vocab_size, tp))
    target = None if dtype == "auto" else common.DTYPES[dtype]
    start = time.perf_counter()
    with common.output_dir(out, force) as tmp, HFReader(hf_dir) as reader, common.process_group():
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.staging-", dir=out.parent))
        try:
            state = _sharded_state(reader, arch, shapes, target, staging)
            dist_checkpointing.save({"model": state}, str(tmp))
            del state
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        common.copy_model_files(hf_dir, tmp)
        marker = {"step": 0, "layout": [tp, pp, 1], "weights_only": True, "converted_from": str(hf_dir)}
        (tmp / common.MARKER).write_text(json.dumps(marker))
    logger.info("converted %s -> %s in %.1f s", hf_dir, out, time.perf_counter() - start)
    return out


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of ``hf-to-megatron``."""
    parser.add_argument("--hf", required=True, type=Path, help="Hugging Face model directory (safetensors)")
    parser.add_argument("--out", required=True, type=Path, help="checkpoint directory to create")
    parser.add_argument("--tp", type=int, default=1, help="tensor-parallel size it will load at (vocab padding)")
    parser.add_argument("--pp", type=int, default=1, help="pipeline-parallel size it will load at (checked)")
    parser.add_argument("--dtype", choices=["auto", *common.DTYPES], default="auto",
                        help="parameter dtype to store (auto: as in the HF files)")
    parser.add_argument("--force", action="store_true", help="replace --out if it exists")


COMMAND = Command("hf-to-megatron", __doc__.splitlines()[0], add_arguments,
                  lambda args: convert(args.hf, args.out, args.tp, args.pp, args.dtype, args.force),
                  "Megatron checkpoint")
"""The command line (``megatron-pc convert hf-to-megatron``, ``python -m conversion.hf_to_megatron``)."""
main = COMMAND.main


if __name__ == "__main__":
    sys.exit(main())
