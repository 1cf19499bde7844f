"""Pooled host buffers (the request-body memory) copy to and from the device intact."""

from __future__ import annotations

import numpy as np

from server.memory.host_pool import HostBufferPool


def test_pool_buffer_round_trips_through_the_device() -> None:
    import cupy

    pool = HostBufferPool()
    buffer = pool.acquire(1 << 20)
    host = np.frombuffer(buffer.view, dtype=np.float32)
    host[:] = np.arange(host.size, dtype=np.float32)
    device = cupy.asarray(host)
    assert float(device.sum()) == float(host.astype(np.float64).sum())
    np.testing.assert_array_equal(cupy.asnumpy(device * 2), host * 2)
    buffer.release()
