"""The import rules of docs/architecture.md, checked over the source with ast
(scripts/import_graph.py): no circle among packages or modules, no forbidden arrow (the product
never imports conversion/, nor benchmarks/), and component configs are leaves."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from helpers.scripts import ROOT, load_script


@pytest.fixture(scope="module")
def graph_tool() -> ModuleType:
    return load_script("import_graph")


def _write(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    for top in ("megatron_pc", "conversion"):
        (root / top).mkdir(exist_ok=True)
    return root


def test_the_repository_has_no_import_circle(graph_tool: ModuleType) -> None:
    modules = graph_tool.module_graph(ROOT)
    assert graph_tool.find_cycles(graph_tool.build_graph(ROOT, modules)) == []
    assert graph_tool.find_cycles(modules) == []


def test_the_repository_breaks_no_import_rule(graph_tool: ModuleType) -> None:
    modules = graph_tool.module_graph(ROOT)
    assert graph_tool.forbidden_arrows(graph_tool.build_graph(ROOT, modules)) == []
    assert graph_tool.config_leaf_violations(modules) == []


def test_a_circle_between_two_packages_is_found_even_through_a_lazy_import(graph_tool: ModuleType, tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "megatron_pc/__init__.py": "", "megatron_pc/a/__init__.py": "", "megatron_pc/b/__init__.py": "",
        "megatron_pc/a/x.py": "from megatron_pc.b.y import f\n",
        "megatron_pc/b/y.py": "def f():\n    from megatron_pc.a import x\n    return x\n",
    })  # fmt: skip
    assert graph_tool.find_cycles(graph_tool.build_graph(root)) == [["megatron_pc.a", "megatron_pc.b"]]


def test_a_circle_of_modules_inside_one_package_is_found(graph_tool: ModuleType, tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "megatron_pc/__init__.py": "", "megatron_pc/a/__init__.py": "",
        "megatron_pc/a/x.py": "from . import y\n", "megatron_pc/a/y.py": "from megatron_pc.a.x import g\n",
    })  # fmt: skip
    assert graph_tool.find_cycles(graph_tool.build_graph(root)) == []
    assert graph_tool.find_cycles(graph_tool.module_graph(root)) == [["megatron_pc.a.x", "megatron_pc.a.y"]]


def test_the_product_importing_conversion_and_a_config_reaching_up_are_refused(graph_tool: ModuleType, tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "megatron_pc/__init__.py": "", "megatron_pc/errors.py": "", "megatron_pc/config.py": "",
        "megatron_pc/d/__init__.py": "", "megatron_pc/d/config.py": "from megatron_pc.errors import E\nfrom megatron_pc.d import help\n",
        "megatron_pc/d/help.py": "from megatron_pc.config import load\n",
        "megatron_pc/d/run.py": "from conversion.common import check\n",
        "conversion/__init__.py": "", "conversion/common.py": "",
    })  # fmt: skip
    modules = graph_tool.module_graph(root)
    assert [a.split(":")[0] for a in graph_tool.forbidden_arrows(graph_tool.build_graph(root, modules))] == ["megatron_pc.d -> conversion"]
    assert graph_tool.config_leaf_violations(modules) == ["megatron_pc.d.config reaches megatron_pc.config"]


def test_cluster_reaching_the_root_config_is_refused(graph_tool: ModuleType, tmp_path: Path) -> None:
    root = _write(tmp_path, {
        "megatron_pc/__init__.py": "", "megatron_pc/config.py": "from megatron_pc.cluster.config import ClusterConfig\n",
        "megatron_pc/cluster/__init__.py": "", "megatron_pc/cluster/config.py": "",
        "megatron_pc/cluster/placement.py": "from megatron_pc.cluster.config import ClusterConfig\n",
        "megatron_pc/cluster/ranks.py": "def f():\n    from megatron_pc.config import Config\n",
    })  # fmt: skip
    arrows = graph_tool.forbidden_arrows(graph_tool.build_graph(root))
    assert [a.split(":")[0] for a in arrows] == ["megatron_pc.cluster -> megatron_pc.config"]
