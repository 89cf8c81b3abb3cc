"""No module uses a private name (``_name``) of another package (scripts/private_imports.py,
over the source with ast): a package's private helpers may change without notice, so another
package that needs one needs it public."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from helpers.scripts import ROOT, load_script


@pytest.fixture(scope="module")
def tool() -> ModuleType:
    return load_script("private_imports")


def test_no_module_uses_a_private_name_of_another_package(tool: ModuleType) -> None:
    assert tool.find_private_uses(ROOT) == []


def test_a_private_import_or_attribute_across_packages_is_found_and_one_inside_a_package_is_not(tool: ModuleType, tmp_path: Path) -> None:
    files = {
        "megatron_pc/__init__.py": "", "megatron_pc/a/__init__.py": "", "megatron_pc/b/__init__.py": "",
        "megatron_pc/a/x.py": "def _helper():\n    pass\n__all__ = []\n",
        "megatron_pc/a/y.py": "from megatron_pc.a.x import _helper\nfrom . import x\nx._helper()\n",  # inside a: allowed
        "megatron_pc/b/z.py": "from megatron_pc.a.x import _helper, __all__\n",
        "benchmarks/__init__.py": "", "benchmarks/w.py": "from megatron_pc.a import x as ax\nax._helper()\nax.public()\n",
    }  # fmt: skip
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    (tmp_path / "conversion").mkdir()
    found = sorted(line.split(": ", 1)[1] for line in tool.find_private_uses(tmp_path))
    assert found == ["benchmarks.w uses megatron_pc.a.x._helper", "megatron_pc.b.z imports megatron_pc.a.x._helper"]
