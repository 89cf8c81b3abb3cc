"""Reports and benchmark records name paths relative to the working directory (the repository
root where benchmarks run), never a machine's absolute prefix, when the path lies inside it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from megatron_pc.analysis.report import write_report
from megatron_pc.analysis.runs import load_run, relative_path


def test_relative_path_is_relative_inside_the_base_and_absolute_outside(tmp_path: Path) -> None:
    inside = tmp_path / "runs" / "a" / "seed_0"
    assert relative_path(inside, tmp_path) == "runs/a/seed_0"
    assert relative_path(tmp_path / "runs" / ".." / "x", tmp_path) == "x"
    outside = tmp_path.parent / "elsewhere"
    assert relative_path(outside, tmp_path) == str(outside.resolve())


def _run(run_dir: Path, strategy: str) -> Path:
    run_dir.mkdir(parents=True)
    rows = [{"step": 0, "val_accuracy": 0.2, "cum_generated": 0},
            {"step": 1, "generated": 8, "cum_generated": 8, "time_total": 1.0, "val_accuracy": 0.4}]  # fmt: skip
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run_dir / "config.yaml").write_text(f"seed: 0\nallocation: {{strategy: {strategy}}}\ndata: {{source: builtin:arithmetic}}\n")
    return run_dir


def test_the_report_records_run_directories_relative_to_the_working_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runs = [load_run(_run(tmp_path / "bench" / s / "seed_0", s).resolve()) for s in ("pilot_commit", "grpo")]
    summary = write_report(runs, tmp_path / "out")
    recorded = [r["run_dir"] for r in summary["regimes"]["default"]["runs"]]
    assert sorted(recorded) == ["bench/grpo/seed_0", "bench/pilot_commit/seed_0"]
    assert os.fspath(tmp_path) not in (tmp_path / "out" / "summary.json").read_text()


def test_kept_benchmark_runs_name_their_run_directory_relative_to_the_repository() -> None:
    # bench step passes run_dir relative to the working directory; a kept config with an
    # absolute one names the machine it was made on.
    configs = sorted((Path(__file__).resolve().parents[2] / "results").rglob("config.yaml"))
    assert configs
    absolute = [str(c) for c in configs if Path(str(yaml.safe_load(c.read_text()).get("run_dir", ""))).is_absolute()]
    assert absolute == []
