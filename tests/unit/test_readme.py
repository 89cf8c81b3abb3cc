"""The README stays a five-minute tour whose commands are the real ones: the two set-up commands
unchanged (and what .ci/run runs), and the checkpoint path it converts the one the tiny run writes."""

from __future__ import annotations

from pathlib import Path

from megatron_pc.config import load_config

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
SETUP = (
    "bash scripts/install.sh && .venv/bin/megatron-pc train configs/tiny_cpu.yaml   # install, then run the main job\n"
    ".venv/bin/python -m pytest                                                     # run the tests\n"
)


def test_the_two_set_up_commands_are_unchanged_and_ci_runs_them() -> None:
    assert f"```bash\n{SETUP}```" in README
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert "bash scripts/install.sh" in ci and "exec .venv/bin/python -m pytest" in ci


def test_the_readme_converts_the_checkpoint_path_the_tiny_run_writes() -> None:
    tiny = load_config(None)
    # driver/checkpoints.py names a step's checkpoint step_<8 digits>; the policy is its policy/ folder.
    path = f"{tiny.resolved_run_dir}/checkpoints/step_{tiny.training.steps:08d}/policy"
    assert f"megatron-pc convert megatron-to-hf --ckpt {path} " in README


def test_the_readme_reads_in_five_minutes() -> None:
    assert len(README.splitlines()) <= 140
