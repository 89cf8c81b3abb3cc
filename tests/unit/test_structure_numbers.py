"""scripts/structure_numbers.py: the numbers of a small checkout made here (lines, longest
files, rooms, arrows, circles, arrows back up, results/ as git tracks it, a weight's control
path), and on this checkout the ones the redesign promised (no arrow back up from cluster/, a
weight's control path entering every file once)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import ModuleType

import pytest

from helpers.scripts import ROOT, load_script


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    return load_script("structure_numbers")


FILES = {
    "megatron_pc/__init__.py": "",
    "megatron_pc/config.py": "from megatron_pc.cluster.config import C\n",
    "megatron_pc/cluster/__init__.py": "",
    "megatron_pc/cluster/config.py": "C = 1\n",
    "megatron_pc/cluster/groups.py": (
        "from megatron_pc.config import Config\nfrom typing import Protocol\n\n"
        "class Group:\n    def push_weights(self):\n        pass\n\n"
        "class Engine:\n    def update_weights(self):\n        pass\n\n"
        "class Sink(Protocol):\n    def update_weights(self): ...\n"
    ),
    "megatron_pc/weight_sync/__init__.py": "",
    "megatron_pc/weight_sync/sync.py": "def sync_weights():\n    pass\n",
    "conversion/__init__.py": "import megatron_pc\n",
}


@pytest.fixture()
def checkout(tmp_path: Path) -> Path:
    for name, text in FILES.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "results").mkdir()
    (tmp_path / "results" / "kept.json").write_bytes(b"x" * 1000)
    (tmp_path / "results" / "untracked.json").write_bytes(b"y" * 50)
    git = ["git", "-C", str(tmp_path), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "add", "results/kept.json"], check=True)
    return tmp_path


def test_the_numbers_of_a_small_checkout(tool: ModuleType, checkout: Path) -> None:
    n = tool.numbers(checkout)
    assert n["lines_per_package"]["megatron_pc.cluster"] == 1 + 13
    assert n["lines_per_top_package"] == {"conversion": 1, "megatron_pc": 1 + 1 + 13 + 2}
    assert n["longest_files"][0] == ("megatron_pc/cluster/groups.py", 13)
    assert n["rooms"] == 6 and n["arrows"] == 3 and n["circles"] == 0  # megatron_pc, its config, cluster, cluster.config, weight_sync, conversion
    assert n["arrows_back_up"] == ["megatron_pc.cluster -> megatron_pc.config"]
    assert (n["results_tracked_files"], n["results_tracked_bytes"]) == (1, 1000)
    assert n["control_path"] == {"megatron_pc/cluster/groups.py": ["Group: push_weights", "Engine: update_weights"],
                                 "megatron_pc/weight_sync/sync.py": ["<module>: sync_weights"]}  # the Protocol is no entry
    assert (n["control_path_files"], n["control_path_entries"]) == (2, 3)
    assert "megatron_pc/cluster/groups.py (entered twice)" in tool.report(n)


def test_this_checkout_keeps_what_the_redesign_promised(tool: ModuleType) -> None:
    n = tool.numbers(ROOT)
    assert n["circles"] == 0 and n["private_names_across_packages"] == 0
    assert not [a for a in n["arrows_back_up"] if a.startswith("megatron_pc.cluster ")]
    assert all(len(entries) == 1 for entries in n["control_path"].values()), n["control_path"]
