"""Helpers shared by tests/integration and tests/gpu (importable as ``helpers``: pytest puts
tests/ on the path for tests/conftest.py)."""
