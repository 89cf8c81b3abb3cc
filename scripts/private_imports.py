"""List the places where a module uses a private name (``_name``) of another package.

A package is ``megatron_pc.<first part>`` (``megatron_pc.driver``; a top-level module such as
``megatron_pc.config`` is one of its own), ``conversion`` or ``benchmarks``. A use is an import
(``from megatron_pc.driver.prepare import _flatten``) or an attribute of an imported module
(``prepare._flatten``); dunder names do not count.

    python scripts/private_imports.py [--root DIR]    # one line per use; exit 1 if there is any

tests/unit/test_private_imports.py runs the same check, so a new use fails the suite.
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOP_PACKAGES = ("megatron_pc", "conversion", "benchmarks")


def package_of(module: str) -> str:
    """``megatron_pc.driver.prepare`` -> ``megatron_pc.driver``; ``benchmarks.faults`` -> ``benchmarks``."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "megatron_pc" else parts[0]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def private_uses(path: Path, module: str) -> list[str]:
    """``path:line: module uses other.module._name`` for every private name of another package."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    mine = package_of(module)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    aliases: dict[str, str] = {}  # local name -> the project module it is bound to
    out: list[str] = []

    def other(target: str) -> bool:
        return target.split(".")[0] in TOP_PACKAGES and package_of(target) != mine

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                if _private(alias.name) and other(base):
                    out.append(f"{path}:{node.lineno}: {module} imports {base}.{alias.name}")
                aliases[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and isinstance(node.value, ast.Name):
            target = aliases.get(node.value.id)
            if target is not None and other(target):
                out.append(f"{path}:{node.lineno}: {module} uses {target}.{node.attr}")
    return out


def find_private_uses(root: Path = ROOT) -> list[str]:
    """Every use, over the three packages of the checkout at ``root``."""
    out: list[str] = []
    for top in TOP_PACKAGES:
        for path in sorted((root / top).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.extend(private_uses(path, ".".join(parts)))
    return out


def main(argv: list[str] | None = None) -> int:
    """Print every use; exit 1 when there is one."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=ROOT, help="the checkout to read (default: this one)")
    args = parser.parse_args(argv)
    uses = find_private_uses(args.root)
    for line in uses:
        print(line)
    print(f"{len(uses)} private name(s) used across packages")
    return 1 if uses else 0


if __name__ == "__main__":
    sys.exit(main())
