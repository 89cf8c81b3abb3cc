"""The test folders have no __init__.py, so pytest imports each test file by its
basename: two files with one name in different folders stop the whole collection
("import file mismatch"). This catches it before CI does."""

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_file_basenames_are_unique() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("*.py"):
        if "__pycache__" in path.parts or path.name in ("__init__.py", "conftest.py"):
            continue
        if (path.parent / "__init__.py").exists():
            continue  # a package: imported by its dotted path, no clash
        by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"test modules sharing a basename (rename one): {clashes}"
