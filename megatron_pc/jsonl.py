"""JSON-lines files, plain or gzip-compressed: one rule for every reader of a run's files.

A live run writes plain ``metrics.jsonl`` and ``trace.jsonl``. Kept results (``results/``, made
by ``scripts/bench_results.sh save``) hold the same files as ``.jsonl.gz``, so that a clone stays
small. Readers name the plain file; :func:`find` answers with whichever of the two is there, and
:func:`read_jsonl` reads either, so a report, a benchmark or a script works on a run directory
and on its kept copy alike. :func:`compress` writes the gzip deterministically (no name, mtime 0),
so saving the same run twice gives the same bytes and git sees no change.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

GZ = ".gz"
"""The suffix of a kept (compressed) file: ``metrics.jsonl`` -> ``metrics.jsonl.gz``."""
LEVEL = 9


def find(path: str | Path) -> Path | None:
    """``path`` if it is a file, else its compressed copy ``path.gz`` if that is one, else None.

    A path that already ends in ``.gz`` is only itself. When both exist the plain file wins: it is
    the one a live (or restored and resumed) run appends to.
    """
    path = Path(path)
    if path.is_file():
        return path
    if path.suffix != GZ and (packed := path.with_name(path.name + GZ)).is_file():
        return packed
    return None


def exists(path: str | Path) -> bool:
    """Whether ``path`` or its compressed copy is a file."""
    return find(path) is not None


def open_text(path: str | Path) -> TextIO:
    """``path`` (or ``path.gz``) opened for reading text; FileNotFoundError names both."""
    found = find(path)
    if found is None:
        raise FileNotFoundError(f"{path}: no such file (nor {Path(path).name}{GZ} beside it)")
    if found.suffix == GZ:
        return io.TextIOWrapper(gzip.open(found, "rb"), encoding="utf-8")
    return found.open(encoding="utf-8")


def iter_jsonl(path: str | Path) -> Iterator[dict[str, Any]]:
    """The rows of a JSON-lines file (plain or ``.gz``), blank lines skipped."""
    with open_text(path) as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All rows of a JSON-lines file (plain or ``.gz``)."""
    return list(iter_jsonl(path))


def count_lines(path: str | Path) -> int:
    """Non-blank lines of a JSON-lines file (plain or ``.gz``)."""
    with open_text(path) as f:
        return sum(1 for line in f if line.strip())


def compress(path: str | Path) -> Path:
    """Replace ``path`` by ``path.gz``, byte-deterministic (level 9, no file name, mtime 0).

    The new file is written beside it and renamed into place before the plain one is removed,
    so an interruption leaves one complete copy."""
    src = Path(path)
    if src.suffix == GZ:
        raise ValueError(f"{src}: already compressed")
    dst = src.with_name(src.name + GZ)
    tmp = dst.with_name(dst.name + ".tmp")
    with src.open("rb") as raw, tmp.open("wb") as out:
        # GzipFile with filename="" and mtime=0 writes a header that depends on nothing but the bytes.
        with gzip.GzipFile(filename="", mode="wb", compresslevel=LEVEL, fileobj=out, mtime=0) as packed:
            shutil.copyfileobj(raw, packed)
    os.replace(tmp, dst)
    src.unlink()
    return dst


def decompress(path: str | Path) -> Path:
    """Replace ``path`` (a ``.gz``) by the plain file it holds."""
    src = Path(path)
    if src.suffix != GZ:
        raise ValueError(f"{src}: not a {GZ} file")
    dst = src.with_suffix("")
    tmp = dst.with_name(dst.name + ".tmp")
    with gzip.open(src, "rb") as packed, tmp.open("wb") as out:
        shutil.copyfileobj(packed, out)
    os.replace(tmp, dst)
    src.unlink()
    return dst


def main(argv: list[str] | None = None) -> int:
    """``python -m megatron_pc.jsonl compress|decompress FILE...`` (used by scripts/bench_results.sh)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m megatron_pc.jsonl", description="(de)compress kept JSON-lines files")
    parser.add_argument("mode", choices=("compress", "decompress"))
    parser.add_argument("files", nargs="+", type=Path)
    args = parser.parse_args(argv)
    for f in args.files:
        (compress if args.mode == "compress" else decompress)(f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
