"""Kept copies of a report, small: what ``scripts/bench_results.sh save`` does to a benchmark's
summary.json and plots before they go under ``results/`` (tracked results stay under 10 MB).

- :func:`compact_json` rewrites a JSON file without indentation: the same values, about half
  the bytes of the report's indented summary.json (report.md is the form to read).
- :func:`shrink_png` rewrites a plot with a 256-colour palette: the same picture to the eye at a
  third to a half of the bytes. The result is deterministic, so saving twice changes nothing.

Both write beside the file and rename it into place, so an interrupted call leaves the old file.

    python -m megatron_pc.analysis.kept FILE...    # .json and .png files
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

from megatron_pc.errors import MegatronPCError


def _replace(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def compact_json(path: str | Path) -> Path:
    """Rewrite ``path`` as one line of JSON with the same values; refuses a file that is not JSON."""
    path = Path(path)
    try:
        value = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise MegatronPCError(f"{path}: not a readable JSON file ({err})") from None
    _replace(path, (json.dumps(value, separators=(",", ":")) + "\n").encode())
    return path


def shrink_png(path: str | Path) -> Path:
    """Rewrite ``path`` with a 256-colour palette (median cut), unless that is not smaller."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    try:
        with Image.open(path) as image:
            if image.mode == "P":
                return path  # already a palette: shrinking again would only lose colours
            paletted = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    except (OSError, UnidentifiedImageError) as err:
        raise MegatronPCError(f"{path}: not a readable PNG ({err})") from None
    buffer = io.BytesIO()
    paletted.save(buffer, format="PNG", optimize=True)
    if buffer.tell() < path.stat().st_size:
        _replace(path, buffer.getvalue())
    return path


def main(argv: list[str] | None = None) -> int:
    paths = [Path(p) for p in (sys.argv[1:] if argv is None else argv)]
    try:
        for path in paths:
            if path.suffix == ".json":
                compact_json(path)
            elif path.suffix == ".png":
                shrink_png(path)
            else:
                raise MegatronPCError(f"{path}: neither .json nor .png")
    except MegatronPCError as err:
        print(f"kept: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
