"""The memory pools on a real GPU: pinned host buffers DMA to the device and back with events,
the device pool honours its cap, and neither grows over 1,000 requests' worth of use."""

from __future__ import annotations

import numpy as np
import pytest

from server.memory.device_pool import DevicePools
from server.memory.host_pool import HostBufferPool


def test_host_pool_hands_out_pinned_memory() -> None:
    import cupy

    pool = HostBufferPool(pinned_limit=64 << 20)
    assert pool.pins
    buffer = pool.acquire(1 << 20)
    assert buffer.pinned
    address = np.frombuffer(buffer.view, np.uint8).ctypes.data
    assert cupy.cuda.pinned_memory.is_memory_pinned(address)
    buffer.release()


def test_pinned_round_trip_with_events() -> None:
    import cupy

    pool = HostBufferPool(pinned_limit=64 << 20)
    source, target = pool.acquire(16 << 20), pool.acquire(16 << 20)
    host = np.frombuffer(source.view, dtype=np.float32)
    host[:] = np.arange(host.size, dtype=np.float32)
    back = np.frombuffer(target.view, dtype=np.float32)
    stream = cupy.cuda.Stream(non_blocking=True)
    device = cupy.empty(host.shape, dtype=np.float32)
    device.set(host, stream=stream)
    copied = stream.record(cupy.cuda.Event(disable_timing=True))
    with stream:
        doubled = device * 2
    doubled.get(stream=stream, out=back, blocking=False)
    done = stream.record(cupy.cuda.Event(disable_timing=True))
    copied.synchronize()
    done.synchronize()
    np.testing.assert_array_equal(back, host * 2)
    source.release()
    target.release()


def test_pinned_pool_is_flat_over_1000_requests() -> None:
    pool = HostBufferPool(pinned_limit=64 << 20)
    sizes = (4096, 1 << 20, 3 << 20)
    for index in range(1_000):
        held = [pool.acquire(size) for size in sizes]
        for buffer in held:
            buffer.release()
        if index == 0:
            warm = pool.stats()
    stats = pool.stats()
    assert stats.allocations == warm.allocations == len(sizes)
    assert stats.pinned_total == warm.pinned_total
    assert stats.pinned_used == 0


def test_device_pool_cap_and_reuse() -> None:
    import cupy

    pools = DevicePools(lambda device: 8 << 20)
    first = pools.empty(0, 4 << 20)
    used, _ = pools.usage()[0]
    assert used >= 4 << 20
    with pytest.raises(cupy.cuda.memory.OutOfMemoryError):
        pools.empty(0, 16 << 20)
    del first
    for _ in range(1_000):
        block = pools.empty(0, 4 << 20)
        del block
    _, held = pools.usage()[0]
    assert held <= 8 << 20
