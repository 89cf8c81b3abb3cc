"""Bad input gives a clear ConversionError naming the file and tensor, leaves no output
behind, and an existing output directory is kept unless --force."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from safetensors.torch import load_file, save_file

from conversion import cli, hf_to_megatron, megatron_to_hf
from megatron_pc.errors import ConversionError
from helpers.models import make_hf_model

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hf_model(tmp_path_factory.mktemp("errors"), "qwen2")


@pytest.fixture(scope="module")
def ckpt(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return hf_to_megatron.convert(tiny, tmp_path_factory.mktemp("errors_ckpt") / "ckpt")


def _copy(src: Path, dest: Path) -> Path:
    shutil.copytree(src, dest)
    return dest


def _siblings(out: Path) -> list[str]:
    return sorted(p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}") or p.name == out.name)


def test_unsupported_architecture_lists_the_supported_ones(tiny: Path, tmp_path: Path) -> None:
    bad = _copy(tiny, tmp_path / "mistral")
    config = json.loads((bad / "config.json").read_text())
    (bad / "config.json").write_text(json.dumps({**config, "model_type": "mistral"}))
    out = tmp_path / "out"
    with pytest.raises(ConversionError, match="'mistral'.*supported: llama, qwen2, qwen3") as err:
        hf_to_megatron.convert(bad, out)
    assert str(bad / "config.json") in str(err.value)
    assert _siblings(out) == []


def test_missing_tensor_names_the_tensor_and_the_directory_and_leaves_nothing(tiny: Path, tmp_path: Path) -> None:
    bad = _copy(tiny, tmp_path / "partial")
    state = load_file(str(bad / "model.safetensors"))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(bad / "model.safetensors"))
    out = tmp_path / "out"
    with pytest.raises(ConversionError, match=r"model\.layers\.1\.mlp\.up_proj\.weight.*missing") as err:
        hf_to_megatron.convert(bad, out)
    assert str(bad) in str(err.value)
    assert _siblings(out) == []


def test_shape_mismatch_names_the_tensor_file_and_both_shapes(tiny: Path, tmp_path: Path) -> None:
    bad = _copy(tiny, tmp_path / "shape")
    state = load_file(str(bad / "model.safetensors"))
    state["model.layers.0.self_attn.k_proj.weight"] = state["model.layers.0.self_attn.k_proj.weight"][:32].clone()
    save_file(state, str(bad / "model.safetensors"))
    with pytest.raises(ConversionError, match=r"model\.safetensors: tensor 'model\.layers\.0\.self_attn\.k_proj"
                                              r"\.weight' has shape \(32, 128\), the config implies \(64, 128\)"):
        hf_to_megatron.convert(bad, tmp_path / "out")
    assert _siblings(tmp_path / "out") == []


def test_truncated_safetensors_file_is_named(tiny: Path, tmp_path: Path) -> None:
    bad = _copy(tiny, tmp_path / "truncated")
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ConversionError, match=r"truncated\S*/model\.safetensors: unreadable safetensors file"):
        hf_to_megatron.convert(bad, tmp_path / "out")
    assert _siblings(tmp_path / "out") == []


def test_shard_listed_in_the_index_but_absent_is_named(tiny: Path, tmp_path: Path) -> None:
    bad = _copy(tiny, tmp_path / "sharded")
    names = list(load_file(str(bad / "model.safetensors")))
    index = {"metadata": {}, "weight_map": {n: "model-00001-of-00002.safetensors" for n in names[:3]}
             | {n: "model-00002-of-00002.safetensors" for n in names[3:]}}
    (bad / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ConversionError, match=r"model-00001-of-00002\.safetensors: missing"):
        hf_to_megatron.convert(bad, tmp_path / "out")


def test_tensor_missing_from_the_megatron_checkpoint_is_named(ckpt: Path, tiny: Path, tmp_path: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    more_layers = _copy(tiny, tmp_path / "cfg")
    (more_layers / "config.json").write_text(json.dumps({**config, "model_type": "qwen3"}))
    out = tmp_path / "hf"
    with pytest.raises(ConversionError, match=r"'decoder\.layers\.self_attention\.q_layernorm\.weight'.*missing from "
                                              r"the checkpoint") as err:
        megatron_to_hf.convert(ckpt, out, hf_config=more_layers)
    assert str(ckpt) in str(err.value)
    assert _siblings(out) == []


def test_checkpoint_whose_shapes_disagree_with_the_config_names_the_tensor(ckpt: Path, tiny: Path, tmp_path: Path) -> None:
    config = json.loads((tiny / "config.json").read_text())
    wider = _copy(tiny, tmp_path / "cfg")
    (wider / "config.json").write_text(json.dumps({**config, "intermediate_size": 512}))
    with pytest.raises(ConversionError, match=r"'decoder\.layers\.mlp\.linear_fc1\.weight' has shape \(2, 512, 128\)"
                                              r"; the config implies \(2, 1024, 128\)"):
        megatron_to_hf.convert(ckpt, tmp_path / "hf", hf_config=wider)


def test_existing_output_directory_is_refused_without_force_and_replaced_with_it(ckpt: Path, tmp_path: Path,
                                                                                 capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "hf"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    argv = ["megatron-to-hf", "--ckpt", str(ckpt), "--out", str(out)]
    assert cli.main(argv) == 2
    assert "already exists; pass --force" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    assert cli.main(argv + ["--force"]) == 0
    assert (out / "model.safetensors").is_file() and not (out / "keep.txt").exists()


def test_failed_forced_conversion_keeps_the_existing_output(tiny: Path, tmp_path: Path) -> None:
    bad = _copy(tiny, tmp_path / "truncated")
    (bad / "model.safetensors").write_bytes(b"\x00" * 16)
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert hf_to_megatron.main(["--hf", str(bad), "--out", str(out), "--force"]) == 2
    assert _siblings(out) == ["ckpt"] and [p.name for p in out.iterdir()] == ["keep.txt"]


def test_not_a_checkpoint_is_named(tiny: Path, tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match=r"not a Megatron distributed checkpoint"):
        megatron_to_hf.convert(tiny, tmp_path / "hf")
