"""Print the package-level import graph of megatron_pc and conversion, and its circles.

A node is a package (``megatron_pc.bench``, ``megatron_pc.config`` for a top-level module,
``conversion``); an arrow A -> B says some module of A imports some module of B, at any place
in the file (a lazy import inside a function is still an arrow: it runs, and a reader follows it).

    python scripts/import_graph.py            # arrows, then circles; exit 1 if there is a circle
    python scripts/import_graph.py --arrows   # arrows only

tests/unit/test_import_graph.py runs the same check, so a new circle fails the suite.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_PACKAGES = ("megatron_pc", "conversion")


def module_name(path: Path, root: Path) -> str:
    """``megatron_pc/bench/step.py`` -> ``megatron_pc.bench.step`` (``__init__`` -> its package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def node_of(module: str) -> str:
    """The graph node a module belongs to: its first two dotted parts (``megatron_pc.bench``)."""
    parts = module.split(".")
    if parts[0] == "conversion":
        return "conversion"
    return ".".join(parts[:2])


def imports_of(path: Path, module: str) -> set[str]:
    """Every project module named by an import statement in ``path`` (relative ones resolved)."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for stmt in ast.walk(tree):
        if isinstance(stmt, ast.Import):
            found.update(alias.name for alias in stmt.names)
        elif isinstance(stmt, ast.ImportFrom):
            if stmt.level:
                base = package.split(".")[: len(package.split(".")) - stmt.level + 1]
                target = ".".join(base + ([stmt.module] if stmt.module else []))
            else:
                target = stmt.module or ""
            found.add(target)
            # ``from megatron_pc import config`` names a module, not an attribute.
            found.update(f"{target}.{alias.name}" for alias in stmt.names)
    return {name for name in found if name.split(".")[0] in TOP_PACKAGES}


def build_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Package-level arrows: node -> the other nodes its modules import."""
    modules = {module_name(p, root): p for top in TOP_PACKAGES for p in (root / top).rglob("*.py")}
    graph: dict[str, set[str]] = {node_of(m): set() for m in modules}
    for module, path in modules.items():
        for target in imports_of(path, module):
            # Keep the longest prefix that is a real module (drops imported attribute names).
            while target and target not in modules:
                target = target.rpartition(".")[0]
            if target and node_of(target) != node_of(module):
                graph[node_of(module)].add(node_of(target))
    return graph


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(components)


def main(argv: list[str] | None = None) -> int:
    """Print arrows and circles; exit 1 when there is a circle."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arrows", action="store_true", help="print the arrows only")
    args = parser.parse_args(argv)
    graph = build_graph()
    for node in sorted(graph):
        if graph[node]:
            print(f"{node} -> {', '.join(sorted(graph[node]))}")
    if args.arrows:
        return 0
    cycles = find_cycles(graph)
    print(f"\n{len(cycles)} circle(s)")
    for cycle in cycles:
        print("  " + " <-> ".join(cycle))
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
