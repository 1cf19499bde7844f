"""One CuPy device memory pool per GPU, each capped at its ``--cuda-memory-pool-byte-size``.

GPU executors take their device batch buffers from here and keep them from one batch to the
next (growing them when a batch needs more), so steady-state serving allocates nothing on the
device. The cap bounds what these buffers may hold; ONNX Runtime's own arena (its
intermediate tensors and outputs) is separate. Without CUDA there are no pools and asking for
one is a clear error, never a crash.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from server.cuda.devices import require_cupy


class DevicePools:
    """Lazily created, limited ``cupy.cuda.MemoryPool`` objects keyed by device id."""

    def __init__(self, limit_bytes: Callable[[int], int]) -> None:
        """``limit_bytes(device)`` gives a device's cap (``Settings.cuda_pool_bytes``)."""
        self._limit_bytes = limit_bytes
        self._pools: dict[int, Any] = {}
        self._lock = threading.Lock()

    def pool(self, device: int) -> Any:
        """The memory pool of ``device`` (a ``cupy.cuda.MemoryPool``)."""
        with self._lock:
            found = self._pools.get(device)
            if found is None:
                cupy = require_cupy(f"a device memory pool on GPU {device}")
                with cupy.cuda.Device(device):
                    found = cupy.cuda.MemoryPool()
                    found.set_limit(size=self._limit_bytes(device))
                self._pools[device] = found
            return found

    def empty(self, device: int, nbytes: int) -> Any:
        """A 1-D uint8 CuPy array of ``nbytes`` on ``device``, from its pool."""
        cupy = require_cupy(f"device memory on GPU {device}")
        pool = self.pool(device)
        with cupy.cuda.Device(device):
            return cupy.ndarray((nbytes,), dtype=cupy.uint8, memptr=pool.malloc(nbytes))

    def usage(self) -> dict[int, tuple[int, int]]:
        """``device -> (used bytes, held bytes)`` for the pools created so far."""
        with self._lock:
            pools = dict(self._pools)
        return {device: (pool.used_bytes(), pool.total_bytes()) for device, pool in pools.items()}
