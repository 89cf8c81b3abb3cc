"""Streamed safetensors shards and the checkpoint-key map (pure, no process groups)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from megatron_pc.errors import ConversionError
from conversion.safetensors_io import Planned, ShardedWriter, parse_size
from megatron_pc.models import name_maps


def _tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {"a": torch.randn(10, 4, generator=gen), "b": torch.randn(3, generator=gen).to(torch.bfloat16),
            "c": torch.randn(2, 2, 2, generator=gen), "d": torch.randn(5, generator=gen).half()}


def _write(out: Path, tensors: dict[str, torch.Tensor], max_bytes: int) -> ShardedWriter:
    writer = ShardedWriter(out, [Planned(k, tuple(v.shape), v.dtype) for k, v in tensors.items()], max_bytes)
    for name, tensor in tensors.items():
        writer.write(name, tensor)
    writer.close()
    return writer


def test_streamed_shards_hold_every_tensor_exactly_with_an_index(tmp_path: Path) -> None:
    tensors = _tensors()
    writer = _write(tmp_path, tensors, max_bytes=100)
    # "a" (160 bytes) exceeds the limit alone; b, c, d (48 bytes) share the second shard.
    assert writer.files == ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    back = {k: v for f in writer.files for k, v in load_file(str(tmp_path / f)).items()}
    assert set(index["weight_map"]) == set(tensors) and index["metadata"]["total_size"] == 160 + 6 + 32 + 10
    assert all(back[k].dtype == v.dtype and torch.equal(back[k], v) for k, v in tensors.items())


def test_one_shard_is_a_plain_model_safetensors_without_index(tmp_path: Path) -> None:
    _write(tmp_path, _tensors(), max_bytes=10**9)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.safetensors"]


def test_writer_refuses_an_unplanned_tensor_and_an_incomplete_close(tmp_path: Path) -> None:
    writer = ShardedWriter(tmp_path, [Planned("a", (2,), torch.float32), Planned("b", (2,), torch.float32)], 10**6)
    with pytest.raises(ConversionError, match="expected tensor 'a'"):
        writer.write("b", torch.zeros(2))
    writer.write("a", torch.zeros(2))
    with pytest.raises(ConversionError, match="next missing: 'b'"):
        writer.close()


def test_parse_size_reads_decimal_and_binary_units() -> None:
    assert parse_size("5GB") == 5 * 10**9 and parse_size("2GiB") == 2 * 2**30 and parse_size("123") == 123
    with pytest.raises(ConversionError, match="--max-shard-size"):
        parse_size("lots")


def test_checkpoint_keys_stack_layers_and_use_the_te_norm_names() -> None:
    assert name_maps.checkpoint_key("decoder.layers.7.input_layernorm.weight") == (
        "decoder.layers.self_attention.linear_qkv.layer_norm_weight", 7)
    assert name_maps.checkpoint_key("decoder.layers.0.mlp.linear_fc1.weight") == ("decoder.layers.mlp.linear_fc1.weight", 0)
    assert name_maps.checkpoint_key("output_layer.weight") == ("output_layer.weight", None)
