"""The kept results a clone carries: at most 10 MB tracked under results/, every JSON-lines file
compressed deterministically, no start model's weights in the tree; and the start model comes
back from git history (``scripts/bench_results.sh restore``), checked by its fingerprint, with a
clear message in a shallow clone."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LIMIT_BYTES = 10_000_000
"""Tracked results/ at most 10 MB (issue #42: results a reader can open)."""


def _tracked_results() -> list[Path]:
    listed = subprocess.run(["git", "ls-files", "-z", "results"], cwd=REPO, capture_output=True, check=True).stdout.split(b"\0")
    return [REPO / os.fsdecode(name) for name in listed if name]


@pytest.fixture(scope="module")
def tracked() -> list[Path]:
    files = _tracked_results()
    assert files, "git ls-files lists nothing under results/"
    return files


def test_tracked_results_are_at_most_10_mb(tracked: list[Path]) -> None:
    total = sum(p.stat().st_size for p in tracked if p.is_file())
    largest = sorted(tracked, key=lambda p: p.stat().st_size if p.is_file() else 0)[-3:]
    assert total <= LIMIT_BYTES, f"results/ holds {total:,} B tracked (limit {LIMIT_BYTES:,}); largest: " + ", ".join(
        f"{p.relative_to(REPO)} {p.stat().st_size:,} B" for p in largest)


def test_every_kept_json_lines_file_is_compressed_deterministically(tracked: list[Path]) -> None:
    plain = [p.relative_to(REPO).as_posix() for p in tracked if p.name.endswith(".jsonl")]
    assert not plain, f"plain JSON-lines files under results/ (compress them: python -m megatron_pc.jsonl compress): {plain[:5]}"
    packed = [p for p in tracked if p.name.endswith(".jsonl.gz")]
    assert packed
    for p in packed:
        head = p.read_bytes()[:10]
        # RFC 1952: magic, deflate, no FNAME flag, mtime 0 (megatron_pc.jsonl.compress writes exactly this).
        assert head[:3] == b"\x1f\x8b\x08" and not head[3] & 0x08 and head[4:8] == b"\0\0\0\0", p.relative_to(REPO)


def test_no_start_model_weights_are_tracked_and_every_record_names_one(tracked: list[Path]) -> None:
    weights = [p.relative_to(REPO).as_posix() for p in tracked if "start_models" in p.parts]
    assert not weights, f"start model files in the tree (they are restored from git history): {weights[:3]}"
    records = [p for p in tracked if p.name == "start_model.json"]
    assert records and all(len(json.loads(p.read_text())["sha256"]) == 64 for p in records)


def test_every_kept_run_directory_holds_its_metrics_and_config(tracked: list[Path]) -> None:
    from megatron_pc.analysis.runs import metrics_file

    runs = {p.parent for p in tracked if p.parent.name.startswith("seed_") and p.name == "config.yaml"}
    assert runs and all(metrics_file(r) is not None for r in runs)
    assert {p.parent for p in tracked if p.name == "metrics.jsonl.gz" and p.parent.name.startswith("seed_")} == runs


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True, env=env).stdout


def _repo_with_a_model_in_history(tmp_path: Path) -> tuple[Path, str]:
    """A git repository whose results/bench/start_models/SHA held a model, removed from the tree
    in a later commit; the script copied in. Returns the repository and the model's fingerprint."""
    from benchmarks.strategies import model_fingerprint

    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    shutil.copy(REPO / "scripts" / "bench_results.sh", repo / "scripts")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"hidden_size": 8}')
    (model / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (model / "tokenizer.json").write_text("{}")
    sha = model_fingerprint(model)
    kept = repo / "results" / "bench" / "start_models" / sha[:12]
    shutil.copytree(model, kept)
    run = repo / "results" / "bench" / "paper_like"
    run.mkdir(parents=True)
    (run / "start_model.json").write_text(json.dumps({"path": "models/tiny", "sha256": sha}) + "\n")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "results with the model")
    _git(repo, "rm", "-q", "-r", "results/bench/start_models")
    _git(repo, "commit", "-q", "-m", "the model out of the tree")
    return repo, sha


def test_restore_takes_the_start_model_from_git_history_and_checks_its_fingerprint(tmp_path: Path) -> None:
    from benchmarks.strategies import model_fingerprint

    repo, sha = _repo_with_a_model_in_history(tmp_path)
    work = tmp_path / "work"
    work.mkdir()
    script = repo / "scripts" / "bench_results.sh"
    proc = subprocess.run(["bash", str(script), "restore", "runs/bench", str(repo / "results" / "bench")], cwd=work,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"start model {sha[:12]} put back at models/tiny (from git history" in proc.stdout
    assert model_fingerprint(work / "models" / "tiny") == sha
    # Saving again does not copy a model that history keeps.
    proc = subprocess.run(["bash", str(script), "save", "runs/bench", str(tmp_path / "again")], cwd=work,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "is kept in git history; not copied" in proc.stdout and not (tmp_path / "again" / "start_models").exists()


def test_restore_refuses_a_model_whose_fingerprint_differs_from_the_record(tmp_path: Path) -> None:
    repo, sha = _repo_with_a_model_in_history(tmp_path)
    record = repo / "results" / "bench" / "paper_like" / "start_model.json"
    record.write_text(json.dumps({"path": "models/tiny", "sha256": sha[:12] + "0" * 52}) + "\n")
    proc = subprocess.run(["bash", str(repo / "scripts" / "bench_results.sh"), "restore", str(tmp_path / "runs"),
                           str(repo / "results" / "bench")], cwd=tmp_path, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2 and "does not have fingerprint" in proc.stderr


def test_restore_in_a_shallow_clone_says_how_to_get_the_history(tmp_path: Path) -> None:
    repo, sha = _repo_with_a_model_in_history(tmp_path)
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True, capture_output=True, timeout=120)
    proc = subprocess.run(["bash", str(shallow / "scripts" / "bench_results.sh"), "restore", "runs/bench", "results/bench"],
                          cwd=shallow, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert proc.returncode == 2
    assert f"start model {sha[:12]} is kept in git history only, and this clone is shallow: run 'git fetch --unshallow'" in proc.stderr
    assert not (shallow / "models" / "tiny").exists()


def test_the_script_fingerprint_is_the_benchmark_one(tmp_path: Path) -> None:
    from benchmarks.strategies import MODEL_FILES, model_fingerprint

    model = tmp_path / "m"
    model.mkdir()
    for i, name in enumerate(MODEL_FILES[:2]):  # one deciding file absent: it is left out of both
        (model / name).write_bytes(gzip.compress(bytes([i]) * 100))
    code = f'source <(sed -n "/^fingerprint()/,/^}}/p" {REPO / "scripts" / "bench_results.sh"}); fingerprint {model}'
    out = subprocess.run(["bash", "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert out == model_fingerprint(model)
