"""scripts/trained_groups.py: informative groups, prompts, concentration and success rate per label,
from the finished runs' traces only; bad traces named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "trained_groups.py"


def _run(regime: Path, label: str, seed: int, groups: list[tuple[int, int, int]], finished: bool = True) -> Path:
    """A run whose trace trained these (prompt, size, successes) groups."""
    run = regime / f"{label}@reference" / f"seed_{seed}"
    run.mkdir(parents=True)
    events = [{"event": "generate", "step": 1, "rollouts": 64}]
    events += [{"event": "train_group", "step": 1, "prompt": p, "size": n, "successes": k} for p, n, k in groups]
    (run / "trace.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    if finished:
        run.with_name(f"seed_{seed}.wall.json").write_text("{}")
    return run


def _table(regime: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), str(regime), *extra], capture_output=True, text=True)


def test_only_groups_with_differing_rewards_count_and_seeds_give_ranges(tmp_path: Path) -> None:
    regime = tmp_path / "mixed"
    # Seed 0: prompt 1 twice (informative), prompt 2 once, prompt 3 all right and prompt 4 all wrong (not informative).
    _run(regime, "pc_meta", 0, [(1, 4, 1), (1, 4, 3), (2, 4, 2), (3, 4, 4), (4, 4, 0)])
    _run(regime, "pc_meta", 1, [(5, 4, 2), (6, 4, 2)])
    _run(regime, "grpo", 0, [(7, 4, 1)], finished=False)  # still running: left out
    out = _table(regime, "--top", "1")
    assert out.returncode == 0, out.stderr
    # Seed 0: 3 groups on 2 prompts, 2 of 3 on the most trained one, mean success (0.25 + 0.75 + 0.5) / 3;
    # seed 1: 2 groups on 2 prompts, 1 of 2 on its top prompt, mean 0.5.
    assert "| pc_meta | 2 | 2-3 | 2 | 0.50-0.67 | 0.50 |" in out.stdout
    assert "grpo" not in out.stdout


def test_bad_traces_and_empty_folders_are_named(tmp_path: Path) -> None:
    empty = _table(tmp_path)
    assert empty.returncode == 1 and "no runs (LABEL/seed_K) under it" in empty.stderr
    run = _run(tmp_path / "hard", "dapo", 0, [])
    (run / "trace.jsonl").write_text('{"event": "train_group", "step": 1, "prompt": 3}\n')
    bad = _table(tmp_path / "hard")
    assert bad.returncode == 1 and "trace.jsonl: line 1: a train_group event without a whole size, successes and prompt" in bad.stderr
    (run / "trace.jsonl").write_text("{oops\n")
    assert "trace.jsonl: not JSON lines" in _table(tmp_path / "hard").stderr
    (run / "trace.jsonl").unlink()
    assert "no trace.jsonl (or trace.jsonl.gz)" in _table(tmp_path / "hard").stderr
    assert "--top: must be >= 1" in _table(tmp_path / "hard", "--top", "0").stderr
