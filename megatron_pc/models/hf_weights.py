"""Load Hugging Face safetensors weights into this rank's Megatron GPTModel (any TP/PP)."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path

import torch

from megatron_pc.errors import ConfigError
from megatron_pc.models import name_maps
from megatron_pc.models.hf_config import HFArch
from megatron_pc.models.provider import padded_vocab_size

logger = logging.getLogger(__name__)

_LOCAL_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")


def shapes_of(arch: HFArch, tp: int) -> name_maps.Shapes:
    """The layout facts the name maps need."""
    return name_maps.Shapes(arch.num_heads, arch.num_kv_heads, arch.head_dim, arch.vocab_size,
                            padded_vocab_size(arch.vocab_size, tp))


def safetensors_files(model_dir: str | Path) -> list[Path]:
    """The checkpoint's safetensors files (sharded via the index, or a single file)."""
    root = Path(model_dir)
    index = root / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [root / n for n in names]
    files = sorted(root.glob("*.safetensors"))
    if not files:
        raise ConfigError("model.path", f"no *.safetensors in {root}")
    return files


def global_names(model: torch.nn.Module) -> Iterator[tuple[str, torch.nn.Parameter]]:
    """(name with the *global* layer index, parameter) for this stage's parameters.

    A pipeline stage numbers its layers from 0; ``layer_number`` (1-based) is global."""
    layers = model.decoder.layers if hasattr(model, "decoder") else []
    for name, param in model.named_parameters():
        match = _LOCAL_LAYER.match(name)
        if match:
            layer = layers[int(match.group(1))].layer_number - 1
            name = f"decoder.layers.{layer}." + name[match.end():]
        yield name, param


@torch.no_grad()
def load_hf_weights(model: torch.nn.Module, model_dir: str | Path, arch: HFArch) -> None:
    """Copy the HF weights this rank needs into ``model`` (a GPTModel of any stage/shard)."""
    from megatron.core import parallel_state
    from safetensors import safe_open

    tp = parallel_state.get_tensor_model_parallel_world_size()
    tp_rank = parallel_state.get_tensor_model_parallel_rank()
    shapes = shapes_of(arch, tp)
    with ExitStack() as stack:
        readers = [stack.enter_context(safe_open(str(f), framework="pt")) for f in safetensors_files(model_dir)]
        where = {key: r for r in readers for key in r.keys()}
        for name, param in global_names(model):
            entry, layer = name_maps.lookup(arch.family.name, arch.tie_embeddings, name)
            hf_names = [n.format(layer=layer) for n in entry.hf]
            missing = [n for n in hf_names if n not in where]
            if missing:
                raise ConfigError("model.path", f"{model_dir} lacks {missing} (needed for {name})")
            full = name_maps.to_megatron(entry, [where[n].get_tensor(n) for n in hf_names], shapes)
            local = name_maps.shard(entry, full, tp_rank, tp)
            if local.shape != param.shape:
                raise ConfigError("model.path", f"{name}: HF gives {tuple(local.shape)}, model has {tuple(param.shape)}")
            param.copy_(local.to(param.dtype))
    logger.info("loaded HF weights from %s (TP rank %d of %d)", model_dir, tp_rank, tp)
