"""Shared test settings: GPU tests are skipped without CUDA, nothing else is skipped."""

from __future__ import annotations

import os

import pytest

# Tests share two cores; many small processes with many threads each only thrash.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` when CUDA is absent, and only those."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA (tests/gpu run on GPU machines)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
