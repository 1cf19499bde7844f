"""GPU tests run only where CuPy sees a CUDA device; elsewhere the whole tree is skipped."""

from __future__ import annotations

import pytest


def _cuda_device_count() -> int:
    try:
        import cupy
    except ImportError:
        return 0
    try:
        return int(cupy.cuda.runtime.getDeviceCount())
    except RuntimeError:  # no driver or no device: CUDARuntimeError is a RuntimeError
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_device_count() > 0:
        return
    skip = pytest.mark.skip(reason="no CUDA device visible to CuPy")
    for item in items:
        if "gpu_tests" in item.path.parts:
            item.add_marker(skip)
