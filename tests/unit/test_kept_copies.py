"""megatron_pc.analysis.kept: the kept copies of a report's summary.json and plots hold the same
values and picture in fewer bytes, deterministically, and bad files are refused by name."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_pc.analysis.kept import compact_json, shrink_png
from megatron_pc.errors import MegatronPCError


def test_a_compacted_summary_reads_back_to_the_same_values(tmp_path: Path) -> None:
    summary = {"regimes": {"hard": {"targets": [{"accuracy": 0.0701, "ratio": 1.86}], "seeds": [0, 1, 2]}}, "budget": 40960}
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary, indent=1))
    before = path.stat().st_size
    compact_json(path)
    assert json.loads(path.read_text()) == summary
    assert path.stat().st_size < before and path.read_text().count("\n") == 1
    again = path.read_bytes()
    compact_json(path)
    assert path.read_bytes() == again


def test_a_shrunk_plot_keeps_its_size_and_colours_and_is_done_once(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from PIL import Image

    fig, ax = plt.subplots(figsize=(4, 3), dpi=80)
    for k in range(6):
        ax.plot(range(50), [(i * (k + 1)) % 17 for i in range(50)], label=str(k))
    ax.legend()
    path = tmp_path / "plot.png"
    fig.savefig(path)
    plt.close(fig)
    before = path.stat().st_size
    with Image.open(path) as image:
        size, corner = image.size, image.convert("RGB").getpixel((0, 0))
    shrink_png(path)
    assert path.stat().st_size < before
    with Image.open(path) as image:
        assert image.mode == "P" and image.size == size and image.convert("RGB").getpixel((0, 0)) == corner
    once = path.read_bytes()
    shrink_png(path)
    assert path.read_bytes() == once


def test_bad_files_are_refused_naming_them_and_left_as_they_were(tmp_path: Path) -> None:
    broken = tmp_path / "summary.json"
    broken.write_text('{"regimes": ')
    with pytest.raises(MegatronPCError, match="summary.json: not a readable JSON file"):
        compact_json(broken)
    assert broken.read_text() == '{"regimes": '
    fake = tmp_path / "plot.png"
    fake.write_text("not a picture")
    with pytest.raises(MegatronPCError, match="plot.png: not a readable PNG"):
        shrink_png(fake)
    run = subprocess.run([sys.executable, "-m", "megatron_pc.analysis.kept", str(tmp_path / "notes.txt")], capture_output=True, text=True)
    assert run.returncode == 1 and "notes.txt: neither .json nor .png" in run.stderr
