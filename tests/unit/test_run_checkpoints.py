"""Run checkpoints are atomic; damaged or partial ones are detected and skipped."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from megatron_pc.driver.checkpoints import CheckpointManager, verify


def _policy(content: bytes):
    def write(path: Path) -> None:
        path.mkdir()
        (path / "shard.bin").write_bytes(content)

    return write


def test_latest_returns_the_newest_complete_checkpoint(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path, keep=3)
    mgr.save(2, {"step": 2}, _policy(b"a"))
    mgr.save(4, {"step": 4}, _policy(b"b"))
    step, path = mgr.latest()
    assert step == 4 and mgr.load_controller(path) == {"step": 4}
    assert (path / "policy" / "shard.bin").read_bytes() == b"b"


@pytest.mark.parametrize(
    "damage,why",
    [
        (lambda p: (p / "MANIFEST.json").unlink(), "MANIFEST.json is missing"),
        (lambda p: (p / "policy" / "shard.bin").unlink(), "policy/shard.bin is missing"),
        (lambda p: (p / "policy" / "shard.bin").write_bytes(b"trunc"[:2]), "has 2 bytes"),
        (lambda p: (p / "controller.json").write_text('{"step":8}'), "checksum"),  # same size, other bytes
        (lambda p: (p / "MANIFEST.json").write_text("{"), "unreadable"),
        (lambda p: _flip_byte(p / "policy" / "shard.bin", 3), "policy/shard.bin does not match its checksum"),
        (lambda p: (p / "MANIFEST.json").write_text('{"step": 4, "files": {"policy/shard.bin": "5"}}'), "unreadable"),
        # Damage that leaves valid JSON: a key of the manifest or of an entry changed by one byte.
        (lambda p: _replace(p / "MANIFEST.json", b'"step"', b'"rtep"'), "names step None, its directory is step 4"),
        (lambda p: _replace(p / "MANIFEST.json", b'"sha256"', b'"sha257"'), "unreadable"),
    ],
)
def test_a_damaged_checkpoint_is_skipped_for_the_previous_one(tmp_path, damage, why: str) -> None:
    mgr = CheckpointManager(tmp_path, keep=3)
    mgr.save(2, {"step": 2}, _policy(b"good"))
    newest = mgr.save(4, {"step": 9}, _policy(b"newer"))
    damage(newest)
    assert why in verify(newest)
    step, _ = mgr.latest()
    assert step == 2


def _replace(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert old in data
    path.write_bytes(data.replace(old, new, 1))


def _flip_byte(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_the_manifest_holds_a_checksum_of_every_file_and_sizes_alone_do_not_read_them(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path)
    path = mgr.save(1, {"step": 1}, _policy(b"weights"))
    files = json.loads((path / "MANIFEST.json").read_text())["files"]
    assert sorted(files) == ["controller.json", "policy/shard.bin"]
    assert files["policy/shard.bin"] == {"size": 7, "sha256": hashlib.sha256(b"weights").hexdigest()}
    _flip_byte(path / "policy" / "shard.bin", 0)
    assert verify(path, checksums=False) is None and "checksum" in verify(path)


def test_a_manifest_of_the_older_format_is_still_read(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path)
    path = mgr.save(1, {"step": 1}, _policy(b"weights"))
    controller = (path / "controller.json").read_bytes()
    old = {"step": 1, "files": {"controller.json": len(controller), "policy/shard.bin": 7},
           "controller_sha256": hashlib.sha256(controller).hexdigest()}  # fmt: skip
    (path / "MANIFEST.json").write_text(json.dumps(old))
    assert verify(path) is None
    (path / "controller.json").write_bytes(controller.replace(b"1", b"2"))
    assert "controller.json does not match its checksum" in verify(path)


def test_a_save_interrupted_before_the_rename_leaves_the_previous_checkpoint(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path)
    mgr.save(2, {"step": 2}, _policy(b"good"))

    def crash(path: Path) -> None:
        path.mkdir()
        (path / "half").write_bytes(b"x")
        raise KeyboardInterrupt  # killed mid-write

    with pytest.raises(KeyboardInterrupt):
        mgr.save(4, {"step": 4}, crash)
    assert mgr.latest()[0] == 2
    mgr.save(6, {"step": 6}, _policy(b"ok"))  # the next save cleans the leftover
    assert not list((tmp_path / "checkpoints").glob("*.tmp"))


def test_only_the_newest_checkpoints_are_kept(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path, keep=2)
    for step in (1, 2, 3, 4):
        mgr.save(step, {"step": step}, _policy(b"x"))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000003", "step_00000004"]


def test_no_checkpoint_means_a_fresh_run(tmp_path) -> None:
    assert CheckpointManager(tmp_path).latest() is None


def test_a_checkpoint_the_filesystem_refuses_leaves_nothing_half_written_and_the_previous_intact(tmp_path) -> None:
    import subprocess
    import sys

    from benchmarks.faults import SAVE_PAST_LIMIT  # the fault suite's case, run here alone

    out = subprocess.run([sys.executable, "-c", SAVE_PAST_LIMIT, str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "checkpoint of step 4 could not be written" in out.stdout and "File too large" in out.stdout
    assert "step_00000002, is intact" in out.stdout
    mgr = CheckpointManager(tmp_path)
    assert mgr.latest()[0] == 2
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000002"]


def test_a_full_disk_is_named_in_the_error(tmp_path) -> None:
    import errno

    from megatron_pc.driver.checkpoints import CheckpointWriteError

    mgr = CheckpointManager(tmp_path)

    def full(path: Path) -> None:
        path.mkdir()
        (path / "half").write_bytes(b"x")
        raise OSError(errno.ENOSPC, "No space left on device")  # what a rank's write raises on a full disk

    with pytest.raises(CheckpointWriteError, match=r"step 3 could not be written .*: the disk is full \(.* GiB free there when it failed\).*no earlier checkpoint"):
        mgr.save(3, {"step": 3}, full)
    assert list((tmp_path / "checkpoints").iterdir()) == []


def test_without_checksums_the_manifest_holds_sizes_and_a_cut_file_is_still_caught(tmp_path) -> None:
    mgr = CheckpointManager(tmp_path, checksums=False)
    path = mgr.save(1, {"step": 1}, _policy(b"weights"))
    assert json.loads((path / "MANIFEST.json").read_text())["files"]["policy/shard.bin"] == {"size": 7, "sha256": None}
    _flip_byte(path / "policy" / "shard.bin", 0)
    assert verify(path) is None  # what the option gives up
    (path / "policy" / "shard.bin").write_bytes(b"weight")
    assert "has 6 bytes" in verify(path)


@pytest.mark.parametrize("free,reason", [(1 << 20, "the disk is full (the writer said: unexpected pos 704 vs 598)"),
                                         (1 << 40, "the checkpoint writer failed (RuntimeError: unexpected pos 704 vs 598)")])
def test_a_writer_that_hides_the_os_error_is_still_reported_by_what_the_disk_shows(tmp_path, monkeypatch, free: int, reason: str) -> None:
    from megatron_pc.driver import checkpoints
    from megatron_pc.driver.checkpoints import CheckpointWriteError

    # Megatron's writer turns ENOSPC into its own error; the free space at the failure tells.
    monkeypatch.setattr(checkpoints, "_free_bytes", lambda path: free)
    mgr = CheckpointManager(tmp_path)
    mgr.save(1, {"step": 1}, _policy(b"ok"))

    def hidden(path: Path) -> None:
        path.mkdir()
        (path / "half").write_bytes(b"x")
        raise RuntimeError("Worker failure: [enforce fail at inline_container.cc:672] .\nunexpected pos 704 vs 598")

    with pytest.raises(CheckpointWriteError) as err:
        mgr.save(2, {"step": 2}, hidden)
    assert reason in str(err.value) and "step_00000001, is intact" in str(err.value)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step_00000001"]


def test_a_setting_added_since_a_run_was_saved_counts_as_its_default_on_resume(tmp_path) -> None:
    import yaml

    from megatron_pc.config import load_config, to_dict
    from megatron_pc.driver.prepare import record_config
    from megatron_pc.errors import ConfigError

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    old = to_dict(load_config(None, [f"run_dir={run}"]))
    del old["allocation"]["binding"], old["training"]["pipelined"]  # a run saved before these existed
    (run / "config.yaml").write_text(yaml.safe_dump(old))
    record_config(load_config(None, [f"run_dir={run}"]), run)  # the defaults: the same run
    with pytest.raises(ConfigError, match=r"allocation.binding: True -> False"):
        record_config(load_config(None, [f"run_dir={run}", "allocation.binding=false"]), run)
