"""The install and the main job for a user without root (#41): `bash scripts/install.sh` as a
throwaway user (useradd) on a machine without SLURM installs the CPU stack, skips apt-get printing
the one command to run as root and exits 0; the SLURM tests then FAIL with that command (not
skipped); and a 1-step main job trains as that user.

To stay within minutes the user's environment reuses this one's packages: its venv gets a .pth
line naming the test environment's site-packages, so pip finds every requirement installed and
only builds the user's own editable megatron-pc (and upgrades pip). "A machine without SLURM" is a
PATH of every system command but slurm's, munge's and sudo. The test needs root (useradd).
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_slurm_local import CLUSTER_PACKAGES  # noqa: E402  (the packages, not a test)

# The install builds two editable installs and upgrades pip: a few minutes on a quiet machine, much
# longer on a loaded one; the pytest.ini default of 900 s is too short for the whole module there.
pytestmark = [pytest.mark.integration, pytest.mark.timeout(2400)]

REPO = Path(__file__).resolve().parents[2]
ROOT_COMMAND = "apt-get update && apt-get install -y --no-install-recommends slurm-wlm munge"
SYSTEM_BIN = ("/usr/local/bin", "/usr/bin", "/bin", "/usr/sbin", "/sbin")
HIDDEN = {*CLUSTER_PACKAGES, "sudo"}
PASSED_ENV = ("http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY")


@dataclass
class User:
    """A throwaway unprivileged user with a home, a copy of the checkout and a PATH without SLURM."""

    name: str
    home: Path
    repo: Path
    python: str
    path: str

    def run(self, *cmd: str, timeout: float, **env: str) -> subprocess.CompletedProcess[str]:
        """``cmd`` as this user in the copy of the checkout, with a clean environment."""
        base = {"HOME": str(self.home), "PATH": self.path, "USER": self.name, "LANG": "C.UTF-8",
                "OMP_NUM_THREADS": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
                **{k: os.environ[k] for k in PASSED_ENV if k in os.environ}, **env}  # fmt: skip
        full = ["runuser", "-u", self.name, "--", "env", "-i", *(f"{k}={v}" for k, v in base.items()), *cmd]
        return subprocess.run(full, cwd=self.repo, capture_output=True, text=True, timeout=timeout)


def _no_slurm_bin(into: Path) -> str:
    """A folder of links to every system command but slurm's, munge's and sudo: a machine without them."""
    into.mkdir()
    for folder in SYSTEM_BIN:
        for entry in sorted(Path(folder).iterdir()) if Path(folder).is_dir() else ():
            link = into / entry.name
            if entry.name not in HIDDEN and not link.exists() and os.access(entry, os.X_OK) and not entry.is_dir():
                link.symlink_to(entry)
    return str(into)


def _copy_checkout(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    for name in files.splitlines():
        source = REPO / name
        if name.startswith("results/") or not source.is_file():
            continue
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest / name)


def _python_for(name: str) -> str:
    """A Python 3.11 the user may run: this one (often under root's home, closed to others), else the system's."""
    for candidate in (str(Path(sys.executable).resolve()), str(Path(getattr(sys, "_base_executable", sys.executable)).resolve()),
                      "/usr/bin/python3.11", shutil.which("python3.11") or ""):  # fmt: skip
        if candidate and subprocess.run(["runuser", "-u", name, "--", candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 11)"],
                                        capture_output=True, timeout=60).returncode == 0:  # fmt: skip
            return candidate
    pytest.fail("no Python 3.11 that an unprivileged user may run")


def _reusing_venv(user: User, venv: Path, packages: Path) -> None:
    """A venv of the user's whose sys.path also holds ``packages`` (this environment's), so that
    pip finds the requirements installed instead of downloading gigabytes."""
    made = user.run(user.python, "-m", "venv", str(venv), timeout=300)
    assert made.returncode == 0, made.stderr
    own = next(venv.glob("lib/python3.11/site-packages"))
    (own / "_reuse_test_environment.pth").write_text(f"{packages}\n")


@pytest.fixture(scope="module")
def user() -> Iterator[User]:
    assert os.geteuid() == 0, "this test makes a throwaway user (useradd): run it as root"
    name = f"mpc{os.getpid() % 100000}"
    top = Path(tempfile.mkdtemp(prefix="mpc-unpriv-", dir="/tmp"))
    top.chmod(0o755)
    home = top / "home"
    subprocess.run(["useradd", "--create-home", "--home-dir", str(home), "--shell", "/bin/bash", name], check=True, timeout=60)
    try:
        repo = home / "megatron_pc"
        _copy_checkout(repo)
        path = _no_slurm_bin(home / "bin")
        subprocess.run(["chown", "-R", f"{name}:{name}", str(home)], check=True, timeout=120)
        yield User(name, home, repo, _python_for(name), path)
    finally:
        _end_processes_of(name)  # what this test started as the user (a pip or a job cut short by a timeout)
        subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=60)
        shutil.rmtree(top, ignore_errors=True)


def _end_processes_of(name: str) -> None:
    """SIGKILL each process of the throwaway user, by its pid: userdel refuses a user still running one."""
    listed = subprocess.run(["ps", "-u", name, "-o", "pid="], capture_output=True, text=True, timeout=60).stdout
    for pid in (int(p) for p in listed.split()):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass


@pytest.fixture(scope="module")
def installed(user: User) -> tuple[User, subprocess.CompletedProcess[str]]:
    """scripts/install.sh as the user, into venvs that reuse this environment's packages."""
    _reusing_venv(user, user.home / "venv", Path(site.getsitepackages()[0]))
    launch = Path(sys.prefix).with_name(".venv-launch")
    launch_packages = next(launch.glob("lib/python3.11/site-packages"), None) if launch.is_dir() else None
    if launch_packages is not None:
        _reusing_venv(user, user.home / "venv-launch", launch_packages)
    proc = user.run("bash", "scripts/install.sh", timeout=1200, PYTHON=user.python,
                    MEGATRON_PC_VENV=str(user.home / "venv"), MEGATRON_PC_LAUNCH_VENV=str(user.home / "venv-launch"))  # fmt: skip
    return user, proc


def test_install_as_a_user_without_root_skips_slurm_saying_what_to_run_and_exits_0(installed: tuple[User, subprocess.CompletedProcess[str]]) -> None:
    user, proc = installed
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    assert "not root and no password-less sudo: the local SLURM test cluster is NOT installed" in out
    assert f"\n  {ROOT_COMMAND}\n" in out
    assert "megatron-pc installed" in out
    version = user.run(str(user.home / "venv" / "bin" / "megatron-pc"), "--version", timeout=120)
    assert version.returncode == 0 and version.stdout.startswith("megatron-pc "), version.stderr


def test_the_slurm_tests_then_fail_naming_the_root_command(installed: tuple[User, subprocess.CompletedProcess[str]]) -> None:
    user, proc = installed
    assert proc.returncode == 0
    tests = user.run(str(user.home / "venv" / "bin" / "python"), "-m", "pytest", "tests/integration/test_slurm_local.py", "-x", "-q",
                     "-p", "no:cacheprovider", "-k", "batch_job_runs", timeout=600)  # fmt: skip
    out = tests.stdout + tests.stderr
    assert tests.returncode == 1, out[-3000:]
    assert ("1 failed" in out or "1 error" in out) and "skipped" not in out  # the cluster fixture fails: an error of the test
    assert f"as root run: {ROOT_COMMAND}" in out


def test_a_one_step_main_job_trains_as_the_user(installed: tuple[User, subprocess.CompletedProcess[str]], tiny_model_dir: Path) -> None:
    user, proc = installed
    assert proc.returncode == 0
    model = user.home / "model"
    shutil.copytree(tiny_model_dir, model)
    subprocess.run(["chown", "-R", f"{user.name}:{user.name}", str(model)], check=True, timeout=60)
    run = user.home / "run"
    job = user.run(str(user.home / "venv" / "bin" / "megatron-pc"), "train", "configs/tiny_cpu.yaml", f"run_dir={run}", f"model.path={model}",
                   "training.steps=1", "training.validate_every=1", "training.val_samples=1", "data.validation_size=16",
                   "allocation.train_batch=8", "allocation.pilot.batch=24", "training.mini_batch=8",
                   "allocation.on_round_limit=train_partial", "logging.tensorboard=false", timeout=1200)  # fmt: skip
    assert job.returncode == 0, (job.stdout + job.stderr)[-4000:]
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1] and rows[1]["generated"] > 0
    assert run.stat().st_uid == int(subprocess.run(["id", "-u", user.name], capture_output=True, text=True, check=True).stdout)
