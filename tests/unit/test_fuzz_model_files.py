"""Fuzzed damage to Hugging Face model directories and to run checkpoints (hypothesis).

A model directory that does not hold what its config implies (a tensor missing, a tensor of
another shape, a tensor the config leaves out, a config changed under the weights, a cut-off
file) is refused by ``check_hf_weights`` with an error that names the file, tensor or field:
``megatron-pc train`` runs it before any worker starts and ``hf_to_megatron`` before it writes.
A damaged run checkpoint (any byte changed, any file cut short or removed, the manifest
garbled) is never resumed from: the previous complete one is, and the log says why."""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st
from safetensors.torch import load_file, save_file

from megatron_pc.models.hf_check import check_hf_weights
from megatron_pc.errors import ConversionError
from benchmarks.faults import policy_writer
from benchmarks.faults_inputs import tiny_hf_model
from megatron_pc.driver.checkpoints import CheckpointManager
from megatron_pc.errors import MegatronPCError

FUZZ = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-layer Qwen2 (GQA 4/2), saved by transformers."""
    return tiny_hf_model(tmp_path_factory.mktemp("hf") / "qwen2")


def _copy(src: Path, tmp: Path) -> Path:
    dest = tmp / "model"
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(src, dest)
    return dest


def test_the_model_as_saved_passes(hf_dir: Path) -> None:
    assert check_hf_weights(hf_dir).num_layers == 2


@FUZZ
@given(data=st.data())
def test_a_tensor_removed_reshaped_or_added_is_named(hf_dir: Path, tmp_path: Path, data: st.DataObject) -> None:
    model = _copy(hf_dir, tmp_path)
    state = load_file(str(model / "model.safetensors"))
    name = data.draw(st.sampled_from(sorted(state)))
    how = data.draw(st.sampled_from(["remove", "reshape", "add"]))
    if how == "remove":
        del state[name]
    elif how == "reshape":
        t = state[name]
        state[name] = t[: t.shape[0] - data.draw(st.integers(1, t.shape[0] - 1))].clone() if t.shape[0] > 1 else t.repeat(2)
    else:
        name = name.replace("layers.1.", "layers.2.") if "layers.1." in name else "model.extra.weight"
        state[name] = state[sorted(state)[0]].clone()
    save_file(state, str(model / "model.safetensors"))
    with pytest.raises(ConversionError) as err:
        check_hf_weights(model)
    assert name in str(err.value) or (how == "add" and "the config does not imply" in str(err.value)), str(err.value)
    assert str(model) in str(err.value)


CONFIG_FIELDS = {
    "hidden_size": st.sampled_from([32, 48, 128]),
    "intermediate_size": st.sampled_from([64, 128, 1]),
    "num_hidden_layers": st.sampled_from([1, 3, 0]),
    "num_attention_heads": st.sampled_from([2, 8, 3]),
    "num_key_value_heads": st.sampled_from([1, 4, 3]),
    "vocab_size": st.sampled_from([63, 65, 128]),
    "model_type": st.sampled_from(["llama", "qwen3", "mistral", ""]),
    "tie_word_embeddings": st.just(True),
    "head_dim": st.sampled_from([8, 32]),
}


@FUZZ
@given(data=st.data())
def test_a_config_that_no_longer_matches_the_weights_is_refused(hf_dir: Path, tmp_path: Path, data: st.DataObject) -> None:
    model = _copy(hf_dir, tmp_path)
    config = json.loads((model / "config.json").read_text())
    field = data.draw(st.sampled_from(sorted(CONFIG_FIELDS)))
    config[field] = data.draw(CONFIG_FIELDS[field])
    (model / "config.json").write_text(json.dumps(config))
    with pytest.raises(MegatronPCError) as err:
        check_hf_weights(model)
    # The file at fault: config.json when the config itself is refused, else the weights' file
    # or directory, with the tensor that disagrees.
    assert str(model) in str(err.value), str(err.value)


@FUZZ
@given(cut=st.floats(0.0, 0.999))
def test_a_cut_off_weights_file_is_named(hf_dir: Path, tmp_path: Path, cut: float) -> None:
    model = _copy(hf_dir, tmp_path)
    f = model / "model.safetensors"
    data = f.read_bytes()
    f.write_bytes(data[: int(len(data) * cut)])
    with pytest.raises(ConversionError, match="model.safetensors"):
        check_hf_weights(model)


@FUZZ
@given(data=st.data())
def test_any_damage_to_the_newest_checkpoint_falls_back_to_the_previous_and_says_why(tmp_path: Path, data: st.DataObject,
                                                                                     caplog: pytest.LogCaptureFixture) -> None:  # fmt: skip
    root = tmp_path / "run"
    shutil.rmtree(root, ignore_errors=True)
    mgr = CheckpointManager(root, keep=2)
    mgr.save(1, {"step": 1}, policy_writer(bytes(range(256)) * 4))
    newest = mgr.save(2, {"step": 2}, policy_writer(bytes(range(255, -1, -1)) * 4))
    files = sorted(p for p in newest.rglob("*") if p.is_file())
    target = data.draw(st.sampled_from(files))
    blob = target.read_bytes()
    how = data.draw(st.sampled_from(["flip", "truncate", "remove", "append"]))
    if how == "flip":
        at = data.draw(st.integers(0, len(blob) - 1))
        target.write_bytes(blob[:at] + bytes([blob[at] ^ data.draw(st.integers(1, 255))]) + blob[at + 1 :])
    elif how == "truncate":
        target.write_bytes(blob[: data.draw(st.integers(0, len(blob) - 1))])
    elif how == "remove":
        target.unlink()
    else:
        target.write_bytes(blob + b"\0")
    # A flip that turns one JSON whitespace into another (a newline into a tab) leaves the
    # manifest as it was: no damage to detect.
    assume(target.suffix != ".json" or not target.exists() or not _same_json(blob, target.read_bytes()))
    with caplog.at_level(logging.WARNING, logger="megatron_pc.driver.checkpoints"):
        caplog.clear()
        step, path = mgr.latest()
    assert step == 1 and mgr.load_controller(path) == {"step": 1}
    assert f"skipping damaged checkpoint {newest}" in caplog.text


def _same_json(before: bytes, after: bytes) -> bool:
    """Whether two JSON files hold the same value (False when either is no JSON)."""
    try:
        return bool(json.loads(before) == json.loads(after))
    except ValueError:
        return False
