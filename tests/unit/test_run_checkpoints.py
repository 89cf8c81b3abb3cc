"""Run checkpoints are atomic; damaged or partial ones are detected and skipped."""

from __future__ import annotations

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
