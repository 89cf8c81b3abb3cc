"""The repository's scripts/ (import_graph.py, private_imports.py, structure_numbers.py) loaded
as modules, for the unit tests that run their checks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
"""The checkout these tests belong to."""


def load_script(name: str) -> ModuleType:
    """``scripts/<name>.py`` as the module ``name`` (registered before it runs, as an import would)."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
