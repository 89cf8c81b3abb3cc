"""The new user's trial of #41, item by item, through the real command table: --version,
did-you-mean, config names, the benchmark list, data convert's suffix and file modes, format
detection (closest formats, one error a file, agent columns), data files checked before a run,
and the report's matplotlib hint."""

from __future__ import annotations

import builtins
import json
import logging
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from benchmarks.cli import BENCHES
from megatron_pc.analysis import report_plots
from megatron_pc.cli import COMMANDS, main
from megatron_pc.data.convert import read_records
from megatron_pc.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _verl_jsonl(path: Path, rows: int = 3, **extra: Any) -> Path:
    lines = [{"data_source": "gsm8k", "prompt": [{"role": "user", "content": f"{i}+1?"}], "reward_model": {"ground_truth": str(i + 1)},
              "extra_info": {"index": i, "split": "train"}, **extra} for i in range(rows)]  # fmt: skip
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_version_prints_the_installed_version(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, "--version")
    assert code == 0 and out.startswith("megatron-pc ") and out.strip() != "megatron-pc"


def test_a_mistyped_command_suggests_the_close_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "trian")
    assert code == 2 and "unknown command 'trian'; did you mean train?" in err
    code, _, err = _run(capsys, "bench", "rollots")
    assert code == 2 and "unknown name 'rollots'; did you mean rollouts?" in err


def test_a_mistyped_choice_suggests_the_close_one(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = _run(capsys, "config", "allocation.strategy=gpro")
    assert code == 2
    assert "allocation.strategy: must be one of 'pilot_commit', 'grpo', 'dapo', " in err and "got 'gpro'; did you mean 'grpo'?" in err


def test_the_top_help_and_bench_help_list_every_benchmark(capsys: pytest.CaptureFixture[str]) -> None:
    bench_line = COMMANDS.commands["bench"][1]
    assert [name for name in BENCHES.commands if name not in bench_line] == []
    code, out, _ = _run(capsys, "bench", "--help")
    assert code == 0 and all(f"  {name} " in out for name in BENCHES.commands)


def test_config_resolves_a_config_name_and_lists_every_missing_data_file(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "config", "qwen3_14b")
    assert code == 2
    assert "data.source: data/polaris-53k.jsonl: no such file" in err
    assert "data.validation[6].path: data/olympiadbench.jsonl: no such file" in err and str(tmp_path) in err
    code, out, _ = _run(capsys, "config", "qwen3_14b", "--no-data-check")
    assert code == 0 and "name: qwen3_14b" in out
    code, _, err = _run(capsys, "plan", "qwen3_14b", "--nodes", "8")
    assert code == 2 and "data.validation[6].path: data/olympiadbench.jsonl: no such file" in err
    (tmp_path / "data").mkdir()
    for name in ("polaris-53k", "aime24", "aime25", "amc23", "math500", "deepmath-103k-test", "minerva_math", "olympiadbench"):
        _verl_jsonl(tmp_path / "data" / f"{name}.jsonl")
    code, out, _ = _run(capsys, "plan", "qwen3_14b", "--nodes", "8")
    assert code == 0 and "fits" in out


def test_data_convert_refuses_an_output_not_named_jsonl_and_writes_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = _verl_jsonl(tmp_path / "train.jsonl")
    code, _, err = _run(capsys, "data", "convert", str(source), "--out", str(tmp_path / "out.parquet"))
    assert code == 2 and "the output must be named .jsonl (got .parquet)" in err
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640)])
def test_data_convert_output_takes_the_umasks_mode(tmp_path: Path, umask: int, mode: int) -> None:
    source = _verl_jsonl(tmp_path / "train.jsonl")
    out = tmp_path / "out.jsonl"
    script = f"import os, sys; os.umask({umask}); from megatron_pc.cli import main; sys.exit(main(['data', 'convert', {str(source)!r}, '--out', {str(out)!r}]))"
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    assert stat.S_IMODE(os.stat(out).st_mode) == mode
    assert [r.id for r in read_records(out)] == ["gsm8k/train/0", "gsm8k/train/1", "gsm8k/train/2"]


def test_columns_of_no_format_list_the_formats_closest_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"question": "1+1?", "answer": "2"}) + "\n")
    code, out, _ = _run(capsys, "data", "inspect", str(qa))
    assert code == 1
    assert "no known format has these columns (answer, question); the known formats, closest first: " in out
    listed = out.split("closest first: ")[1].split("; name one")[0].split("; ")
    assert listed[0] in ("ours lacks id, prompt", "deepmath lacks difficulty, final_answer") and len(listed) == 6
    assert "verl lacks prompt, reward_model" in listed


def test_a_wrong_format_is_one_error_for_the_file_not_one_a_row(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "polaris.jsonl"
    path.write_text("".join(json.dumps({"problem": f"{i}+1?", "answer": str(i + 1), "difficulty": "1/8"}) + "\n" for i in range(500)))
    code, out, _ = _run(capsys, "data", "inspect", str(path), "--format", "verl")
    assert code == 1 and "problems: 1\n" in out
    assert "format verl needs the columns prompt, reward_model, which the file lacks (its columns: answer, difficulty, problem)" in out


def test_verl_agent_columns_are_warned_about_once_per_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _verl_jsonl(tmp_path / "agent.jsonl", rows=5, agent_name="tool_agent")
    with caplog.at_level(logging.WARNING, logger="megatron_pc.data.convert"):
        assert len(read_records(path)) == 5
    warnings = [r.getMessage() for r in caplog.records if "agent columns" in r.getMessage()]
    assert len(warnings) == 1 and "agent_name" in warnings[0] and "single-turn" in warnings[0]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="megatron_pc.data.convert"):
        read_records(_verl_jsonl(tmp_path / "plain.jsonl"))
    assert not [r for r in caplog.records if "agent columns" in r.getMessage()]


def test_the_reports_matplotlib_hint_names_this_environment_not_the_cpu_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    real_import = builtins.__import__

    def no_matplotlib(name: str, *args: Any, **kwargs: Any) -> Any:
        if name.startswith("matplotlib"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ImportError) as err:
        report_plots._pyplot()
    assert f"{sys.executable} -m pip install 'matplotlib>=3.8'" in str(err.value) and "[cpu]" not in str(err.value)


def test_matplotlib_is_in_the_gpu_set() -> None:
    from test_gpu_requirements import gpu_requirements

    assert "matplotlib" in {r.name for r in gpu_requirements()}


def test_an_unknown_config_name_lists_the_known_ones() -> None:
    from megatron_pc.config import load_config

    with pytest.raises(ConfigError, match="qwen3_14b"):
        load_config("qwen3_13b")
