"""DevicePools without CUDA: nothing is created, and asking for device memory is a clear
error. (The pools themselves are exercised on a GPU by ``gpu_tests/``.)"""

from __future__ import annotations

import pytest

from server.cuda import devices
from server.errors import ModelLoadError
from server.memory.device_pool import DevicePools


def test_without_cuda_a_pool_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devices, "cupy_module", lambda: None)
    pools = DevicePools(lambda device: 1 << 20)
    with pytest.raises(ModelLoadError, match="needs a CUDA device and CuPy"):
        pools.empty(0, 1024)
    assert pools.usage() == {}
