"""Print the numbers of a checkout's structure: what the redesign steps (issues #41, #42) measure.

- lines per package (``megatron_pc.<package>``, its top-level modules together, ``conversion``,
  ``benchmarks``), and each top package's share;
- the 3 longest files;
- the package graph of scripts/import_graph.py: its nodes ("rooms"), arrows and circles, and the
  arrows back up: those that climb the layers of docs/architecture.md (:data:`LAYERS`);
- private names used across packages (scripts/private_imports.py);
- the size of ``results/`` as git tracks it (files and bytes);
- the files a weight's control path crosses: every file of the product that defines one of the
  control path's methods (:data:`CONTROL_PATH`), and its entries, the classes (or the module's
  own functions) there that do; a Protocol declares and is not counted. A file entered twice
  makes a reader come back to it.

    python scripts/structure_numbers.py                  # this checkout
    python scripts/structure_numbers.py --root DIR       # another one (read only)
    python scripts/structure_numbers.py --json           # the same as one JSON object
"""

from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import ModuleType
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TOP_PACKAGES = ("megatron_pc", "conversion", "benchmarks")

LAYERS: tuple[tuple[str, ...], ...] = (
    ("megatron_pc", "megatron_pc.errors", "megatron_pc.fields", "megatron_pc.console", "megatron_pc.jsonl"),
    ("megatron_pc.platform", "*.config"),
    ("megatron_pc.allocation", "megatron_pc.data", "megatron_pc.reward", "megatron_pc.rollout", "megatron_pc.weight_sync", "megatron_pc.models"),
    ("megatron_pc.algo", "megatron_pc.training", "megatron_pc.metrics"),
    ("megatron_pc.cluster",),
    ("megatron_pc.config", "megatron_pc.config_cli"),
    ("megatron_pc.driver",),
    ("megatron_pc.launch", "megatron_pc.analysis"),
    ("megatron_pc.bench", "benchmarks", "conversion"),
    ("megatron_pc.commands", "megatron_pc.cli", "megatron_pc.__main__"),
)
"""The layers, lowest first (docs/architecture.md, "Import rules"); ``*.config`` is every
component's config module. An arrow to a higher layer is an arrow back up."""

CONTROL_PATH = frozenset({
    "sync_weights", "open_weight_channel", "connect_weight_channel", "close_weight_channel", "push_weights",
    "weight_sync_stats", "weight_receivers", "join_weight_channel", "leave_weight_channel", "update_weights",
    "join_in_worker", "load_in_worker", "leave_in_worker",
})  # fmt: skip
"""The methods a weight's control passes through from the driver's sync to the engine workers
(the transports' own Sender / Receiver internals are not counted: they are the data path)."""


def _tool(name: str) -> ModuleType:
    """A sibling script, loaded as a module."""
    spec = importlib.util.spec_from_file_location(f"structure_{name}", HERE / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def python_files(root: Path) -> list[Path]:
    """The .py files of the three packages."""
    return sorted(p for top in TOP_PACKAGES if (root / top).is_dir() for p in (root / top).rglob("*.py"))


def package_of(path: Path, root: Path) -> str:
    """``megatron_pc/driver/x.py`` -> ``megatron_pc.driver``; a top-level module -> ``megatron_pc (top-level)``."""
    parts = path.relative_to(root).parts
    if parts[0] != "megatron_pc":
        return parts[0]
    return f"megatron_pc.{parts[1]}" if len(parts) > 2 else "megatron_pc (top-level)"


def line_count(path: Path) -> int:
    """Lines of a file, as ``wc -l`` counts them."""
    return path.read_bytes().count(b"\n")


def layer_of(node: str) -> int | None:
    """The layer of a graph node (None: not placed)."""
    for level, names in enumerate(LAYERS):
        if node in names or ("*.config" in names and node.count(".") == 2 and node.endswith(".config")):
            return level
    return None


def _is_protocol(cls: ast.ClassDef) -> bool:
    """A typing Protocol: it declares what a hop must offer and is none itself."""
    return any((isinstance(b, ast.Name) and b.id == "Protocol") or (isinstance(b, ast.Attribute) and b.attr == "Protocol") for b in cls.bases)


def _methods(node: ast.Module | ast.ClassDef) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    return [n for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name in CONTROL_PATH]


def control_path_methods(root: Path) -> list[tuple[str, str, int]]:
    """(file, method, lines) of every control-path method of the product (Protocols left out)."""
    out = []
    for path in sorted((root / "megatron_pc").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        scopes: list[ast.Module | ast.ClassDef] = [tree, *(n for n in tree.body if isinstance(n, ast.ClassDef) and not _is_protocol(n))]
        out += [(str(path.relative_to(root)), fn.name, (fn.end_lineno or fn.lineno) - fn.lineno + 1) for scope in scopes for fn in _methods(scope)]
    return out


def control_path(root: Path) -> dict[str, list[str]]:
    """Per product file that defines a control-path method: its entries (classes other than
    Protocols, or ``<module>`` for its functions), each with the methods it defines."""
    out: dict[str, list[str]] = {}
    for path in sorted((root / "megatron_pc").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        entries: list[str] = []
        module_level = sorted(n.name for n in _methods(tree))
        if module_level:
            entries.append(f"<module>: {', '.join(module_level)}")
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and not _is_protocol(n)):
            names = sorted(n.name for n in _methods(cls))
            if names:
                entries.append(f"{cls.name}: {', '.join(names)}")
        if entries:
            out[str(path.relative_to(root))] = entries
    return out


def tracked_results(root: Path) -> tuple[int, int]:
    """(files, bytes) that git tracks under ``results/`` (bytes as the checked-out files hold)."""
    listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "results"], capture_output=True, check=True).stdout
    files = [root / name for name in listed.decode().split("\0") if name]
    return len(files), sum(f.stat().st_size for f in files if f.is_file())


def numbers(root: Path) -> dict[str, Any]:
    """Every number, for the checkout at ``root``."""
    graph_tool = _tool("import_graph")
    files = python_files(root)
    lines = {str(p.relative_to(root)): line_count(p) for p in files}
    per_package: Counter[str] = Counter()
    per_top: Counter[str] = Counter()
    for p in files:
        per_package[package_of(p, root)] += lines[str(p.relative_to(root))]
        per_top[p.relative_to(root).parts[0]] += lines[str(p.relative_to(root))]
    modules = graph_tool.module_graph(root)
    graph = graph_tool.build_graph(root, modules)
    arrows = sorted((a, b) for a in graph for b in graph[a])
    back_up = [f"{a} -> {b}" for a, b in arrows if layer_of(a) is not None and layer_of(b) is not None and layer_of(b) > layer_of(a)]
    path = control_path(root)
    outside = [m for m in control_path_methods(root) if not m[0].startswith("megatron_pc/weight_sync/")]
    results_files, results_bytes = tracked_results(root)
    return {
        "lines_per_package": dict(sorted(per_package.items())),
        "lines_per_top_package": dict(per_top),
        "longest_files": sorted(lines.items(), key=lambda kv: (-kv[1], kv[0]))[:3],
        "rooms": len(graph),
        "arrows": len(arrows),
        "circles": len(graph_tool.find_cycles(graph)) + len(graph_tool.find_cycles(modules)),
        "arrows_back_up": back_up,
        "unplaced_rooms": sorted(n for n in graph if layer_of(n) is None),
        "private_names_across_packages": len(_tool("private_imports").find_private_uses(root)),
        "results_tracked_files": results_files,
        "results_tracked_bytes": results_bytes,
        "control_path_files": len(path),
        "control_path_entries": sum(len(e) for e in path.values()),
        "control_path": path,
        "control_path_methods_outside_weight_sync": len(outside),
        "control_path_lines_outside_weight_sync": sum(m[2] for m in outside),
        "control_path_files_outside_weight_sync": len({m[0] for m in outside}),
        "files_defining": {name: len({m[0] for m in control_path_methods(root) if m[1] == name}) for name in ("join_weight_channel", "update_weights")},
    }


def report(n: dict[str, Any]) -> str:
    """The numbers as text."""
    total = sum(n["lines_per_top_package"].values())
    out = ["lines per package:"]
    out += [f"  {name:32s} {count:6d}" for name, count in n["lines_per_package"].items()]
    out += [f"  {name} in all: {count} ({100 * count / total:.1f}% of {total})" for name, count in n["lines_per_top_package"].items()]
    out.append("longest files: " + ", ".join(f"{name} {count}" for name, count in n["longest_files"]))
    out.append(f"rooms {n['rooms']}, arrows {n['arrows']}, circles {n['circles']}, arrows back up {len(n['arrows_back_up'])}"
               + (f" ({'; '.join(n['arrows_back_up'])})" if n["arrows_back_up"] else ""))  # fmt: skip
    if n["unplaced_rooms"]:
        out.append(f"rooms in no layer: {', '.join(n['unplaced_rooms'])}")
    out.append(f"private names used across packages: {n['private_names_across_packages']}")
    out.append(f"results/ tracked: {n['results_tracked_files']} files, {n['results_tracked_bytes']:,} B")
    out.append(f"a weight's control path: {n['control_path_files']} files, {n['control_path_entries']} entries")
    out.append(f"  outside weight_sync/: {n['control_path_methods_outside_weight_sync']} methods, "
               f"{n['control_path_lines_outside_weight_sync']} lines, in {n['control_path_files_outside_weight_sync']} files; "
               + ", ".join(f"{name} defined in {count} files" for name, count in n["files_defining"].items()))
    for name, entries in n["control_path"].items():
        twice = " (entered twice)" if len(entries) == 2 else f" (entered {len(entries)} times)" if len(entries) > 2 else ""
        out.append(f"  {name}{twice}")
        out += [f"    {entry}" for entry in entries]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Print the numbers of the checkout at ``--root``."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to read (default: this one)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    found = numbers(args.root.resolve())
    print(json.dumps(found, indent=1) if args.json else report(found))
    return 0


if __name__ == "__main__":
    sys.exit(main())
