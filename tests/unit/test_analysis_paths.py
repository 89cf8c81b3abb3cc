"""Reports and benchmark records name paths relative to the working directory (the repository
root where benchmarks run), never a machine's absolute prefix, when the path lies inside it."""

from __future__ import annotations

import json
import os
import re
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


ABSOLUTE_PATH = re.compile(r'(?:^|[ "(`=:])(/[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]*)')
"""An absolute path in kept text (a URL's ``//`` does not match)."""


def test_kept_reports_name_no_absolute_path() -> None:
    # The benchmark's report and summary (the simulator's command among them) record paths
    # relative to the root they ran in; a kept file naming an absolute path of the machine it
    # was made on points at nothing on the reader's.
    results = Path(__file__).resolve().parents[2] / "results"
    kept = sorted([*results.rglob("summary.json"), *results.rglob("report.md"), *results.rglob("config.yaml")])
    assert kept
    offending = [f"{p.relative_to(results)}: {m.group(1)}" for p in kept for m in ABSOLUTE_PATH.finditer(p.read_text())]
    assert offending == []


def test_the_absolute_path_pattern_finds_paths_and_not_urls() -> None:
    found = [m.group(1) for m in ABSOLUTE_PATH.finditer('--success-rates /srv/x/rates.json "/a/b" https://example.org/a')]
    assert found == ["/srv/x/rates.json", "/a/b"]


def test_the_simulator_command_names_the_rates_file_relative_to_the_working_directory(tmp_path: Path,
                                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # What the benchmark records as "reproduce": the rates file as the reader's checkout has it.
    from argparse import Namespace
    from types import SimpleNamespace

    from benchmarks.calibration import simulate_regime

    monkeypatch.chdir(tmp_path)
    rates = tmp_path / "bench" / "mixed" / "success_rates.json"
    rates.parent.mkdir(parents=True)
    rates.write_text(json.dumps({"rates": [i / 20 for i in range(21)] * 5, "samples": 16}))
    config = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"
    args = Namespace(config=str(config), overrides=[], train_size=200, val_size=40, steps=2, seeds=1, validate_every=1)
    measured = {"strategies": {"pilot_commit": {}, "grpo": {}}, "final_gain": {}}
    got = simulate_regime(args, SimpleNamespace(name="mixed"), rates.resolve(), measured, (0.5,))
    assert "--success-rates bench/mixed/success_rates.json " in got["command"]
    assert os.fspath(tmp_path) not in got["command"].replace(str(config), "")
