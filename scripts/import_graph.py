"""Print the package-level import graph of megatron_pc, conversion and benchmarks, and its circles.

A node is a package (``megatron_pc.driver``, ``megatron_pc.config`` for a top-level module,
``conversion``), except that a component's config dataclass module (``megatron_pc.cluster.config``)
is a node of its own: the config layer sits below the root :mod:`megatron_pc.config`, which
composes it, while the component's runtime code sits above (docs/architecture.md). An arrow
A -> B says some module of A imports some module of B, at any place in the file (a lazy import
inside a function is still an arrow: it runs, and a reader follows it).

The rules checked (exit 1 when one is broken): no circle among the nodes, nor among the
modules (``report.py`` <-> ``report_format.py`` is a circle too); no arrow matching a
FORBIDDEN entry; a component config module imports (transitively) only megatron_pc.errors,
megatron_pc.fields and its own package.

    python scripts/import_graph.py            # arrows, then circles; exit 1 if there is a circle
    python scripts/import_graph.py --arrows   # arrows only

tests/unit/test_import_graph.py runs the same checks, so a new circle or broken rule fails the suite.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_PACKAGES = ("megatron_pc", "conversion", "benchmarks")
LEAF_OK = ("megatron_pc.errors", "megatron_pc.fields")
"""What a component config module may import besides its own package."""
FORBIDDEN: tuple[tuple[str, str, str], ...] = (
    ("megatron_pc", "conversion", "conversion/ builds on the product; the product checks HF weights with models/hf_check.py"),
    ("megatron_pc", "benchmarks", "benchmarks sit beside the product and build on it (analysis/ included), never the reverse"),
    ("megatron_pc.metrics", "megatron_pc.launch", "model shapes are models/shapes.py"),
    ("megatron_pc.cluster", "megatron_pc.config", "cluster/ takes its components' configs and the Layout, not the root Config"),
)
"""(importer prefix, imported prefix, why): arrows that must not exist."""


def module_name(path: Path, root: Path) -> str:
    """``megatron_pc/driver/trainer.py`` -> ``megatron_pc.driver.trainer`` (``__init__`` -> its package)."""
    parts = list(path.relative_to(root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def node_of(module: str) -> str:
    """The graph node of a module: its first two dotted parts (``megatron_pc.driver``), or the
    module itself for a component's config module (``megatron_pc.cluster.config``)."""
    parts = module.split(".")
    if parts[0] in ("conversion", "benchmarks"):
        return parts[0]
    if len(parts) == 3 and parts[2] == "config":
        return module
    return ".".join(parts[:2])


def imports_of(path: Path, module: str, modules: set[str]) -> set[str]:
    """The project modules ``path`` imports (relative imports resolved; for ``from P import N``
    the module ``P.N`` when it is one, else ``P``)."""
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
            for alias in stmt.names:
                named = f"{target}.{alias.name}"
                found.add(named if named in modules else target)
    resolved = set()
    for name in found:
        # Keep the longest prefix that is a real module (drops imported attribute names).
        while name and name not in modules:
            name = name.rpartition(".")[0]
        if name:
            resolved.add(name)
    return resolved


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module-level arrows: module -> the project modules it imports."""
    modules = {module_name(p, root): p for top in TOP_PACKAGES for p in (root / top).rglob("*.py")}
    return {module: imports_of(path, module, set(modules)) for module, path in modules.items()}


def build_graph(root: Path = ROOT, modules: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    """Node-level arrows: node -> the other nodes its modules import."""
    modules = module_graph(root) if modules is None else modules
    graph: dict[str, set[str]] = {node_of(m): set() for m in modules}
    for module, targets in modules.items():
        node = node_of(module)
        # A config module's imports of its own package (data/config.py -> data/formats.py) are
        # pure helpers of the config layer, checked by config_leaf_violations, not an arrow up.
        own = node.rpartition(".")[0] if node == module and module.endswith(".config") else None
        graph[node].update(node_of(t) for t in targets if node_of(t) not in (node, own))
    return graph


def forbidden_arrows(graph: dict[str, set[str]]) -> list[str]:
    """The arrows a FORBIDDEN entry rules out, each with its reason."""
    def under(node: str, prefix: str) -> bool:
        return node == prefix or node.startswith(prefix + ".")

    return [f"{a} -> {b}: {why}" for a in sorted(graph) for b in sorted(graph[a])
            for src, dst, why in FORBIDDEN if under(a, src) and under(b, dst)]  # fmt: skip


def config_leaf_violations(modules: dict[str, set[str]]) -> list[str]:
    """Component config modules that reach (transitively) beyond errors, fields and their package."""
    out = []
    for config in sorted(m for m in modules if node_of(m) == m and m.endswith(".config") and m.count(".") == 2):
        own = config.rpartition(".")[0]
        seen, todo = set(), [config]
        while todo:
            for target in modules.get(todo.pop(), ()):
                if target not in seen:
                    seen.add(target)
                    todo.append(target)
        outside = sorted(t for t in seen if not t.startswith(own + ".") and t != own and t not in LEAF_OK)
        if outside:
            out.append(f"{config} reaches {', '.join(outside)}")
    return out


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
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to read (default: this one)")
    args = parser.parse_args(argv)
    modules = module_graph(args.root)
    graph = build_graph(modules=modules)
    for node in sorted(graph):
        if graph[node]:
            print(f"{node} -> {', '.join(sorted(graph[node]))}")
    if args.arrows:
        return 0
    cycles = find_cycles(graph) + find_cycles(modules)
    broken = forbidden_arrows(graph) + config_leaf_violations(modules)
    print(f"\n{len(cycles)} circle(s)")
    for cycle in cycles:
        print("  " + " <-> ".join(cycle))
    print(f"{len(broken)} rule(s) broken")
    for line in broken:
        print("  " + line)
    return 1 if cycles or broken else 0


if __name__ == "__main__":
    sys.exit(main())
