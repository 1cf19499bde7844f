"""HostBufferPool: size classes, reuse after release, alignment, the cache bound."""

from __future__ import annotations

import numpy as np
import pytest

from server.memory.host_pool import PAGE, HostBufferPool


def test_buffers_are_page_aligned_and_sized_to_the_request() -> None:
    pool = HostBufferPool()
    buffer = pool.acquire(100_000)
    assert len(buffer.view) == 100_000
    assert buffer.capacity == 1 << 17  # next power of two
    assert np.frombuffer(buffer.view, np.uint8).ctypes.data % PAGE == 0
    buffer.release()


def test_a_released_buffer_is_reused_for_the_same_class_only() -> None:
    pool = HostBufferPool()
    first = pool.acquire(70_000)
    address = np.frombuffer(first.view, np.uint8).ctypes.data
    first.release()
    assert pool.cached_bytes == first.capacity
    other_class = pool.acquire(1 << 20)
    assert np.frombuffer(other_class.view, np.uint8).ctypes.data != address
    again = pool.acquire(90_000)
    assert np.frombuffer(again.view, np.uint8).ctypes.data == address
    assert pool.cached_bytes == 0


def test_release_twice_returns_the_memory_once() -> None:
    pool = HostBufferPool()
    buffer = pool.acquire(10)
    buffer.release()
    buffer.release()
    assert pool.cached_bytes == buffer.capacity
    a, b = pool.acquire(10), pool.acquire(10)
    assert np.frombuffer(a.view, np.uint8).ctypes.data != np.frombuffer(b.view, np.uint8).ctypes.data


def test_cache_is_bounded() -> None:
    pool = HostBufferPool(max_cached_bytes=1 << 17)
    buffers = [pool.acquire(1 << 16) for _ in range(4)]
    for buffer in buffers:
        buffer.release()
    assert pool.cached_bytes == 1 << 17  # two 64 KiB buffers kept, the rest dropped


def test_resize_stays_within_capacity() -> None:
    buffer = HostBufferPool().acquire(10)
    buffer.resize(buffer.capacity)
    assert len(buffer.view) == buffer.capacity
    with pytest.raises(ValueError):
        buffer.resize(buffer.capacity + 1)
