"""HostBufferPool: size classes, reuse after release, alignment, the cache bound."""

from __future__ import annotations

import gc
import logging

import numpy as np
import pytest

from server.memory.host_pool import PAGE, HostBuffer, HostBufferPool


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


def test_a_pooled_array_goes_back_when_its_last_view_does() -> None:
    pool = HostBufferPool()
    root = pool.array(100_000)
    assert root.nbytes == 100_000 and root.ctypes.data % PAGE == 0
    # what a tensor of it looks like
    view = np.frombuffer(memoryview(root[16:]), np.int32)  # type: ignore[arg-type]
    del root
    gc.collect()
    assert pool.bytes_in_use == 1 << 17, "a view still reads it"
    del view
    gc.collect()
    assert pool.bytes_in_use == 0 and pool.cached_bytes == 1 << 17


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


class FakePinned:
    """Stands in for CuPy's pinned allocation: page-aligned memory it remembers handing out."""

    def __init__(self) -> None:
        self.addresses: set[int] = set()
        self.calls = 0

    def __call__(self, nbytes: int) -> np.ndarray:
        self.calls += 1
        array = np.empty(nbytes + PAGE, dtype=np.uint8)
        start = -array.ctypes.data % PAGE
        view = array[start : start + nbytes]
        self.addresses.add(view.ctypes.data)
        return view


def address(buffer: HostBuffer) -> int:
    return int(np.frombuffer(buffer.view, np.uint8).ctypes.data)


def test_without_cuda_nothing_is_pinned() -> None:
    pool = HostBufferPool()
    assert not pool.pins
    buffer = pool.acquire(10)
    assert not buffer.pinned
    assert pool.stats().pinned_limit == 0 and pool.stats().pageable_fallbacks == 0


def test_pinned_within_the_budget_then_pageable_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    fake = FakePinned()
    pool = HostBufferPool(pinned_limit=1 << 18, pinned_allocator=fake)  # 256 KiB
    first, second = pool.acquire(1 << 17), pool.acquire(1 << 17)
    assert first.pinned and second.pinned
    with caplog.at_level(logging.WARNING, logger="server.memory.host_pool"):
        third = pool.acquire(1 << 16)
        fourth = pool.acquire(1 << 16)
    assert not third.pinned and not fourth.pinned
    assert address(third) not in fake.addresses
    warnings = [r for r in caplog.records if "pinned memory pool exhausted" in r.getMessage()]
    assert len(warnings) == 1, "the warning is rate-limited"
    stats = pool.stats()
    assert (stats.pinned_total, stats.pinned_used) == (1 << 18, 1 << 18)
    assert stats.pageable_used == 2 << 16 and stats.pageable_fallbacks == 2
    first.release()
    assert pool.stats().pinned_used == 1 << 17
    again = pool.acquire(100_000)  # same class as first: its pinned buffer comes back
    assert again.pinned and address(again) == address(first)
    assert fake.calls == 2


def test_a_failed_pinned_allocation_falls_back_to_pageable(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """cudaHostAlloc refusing is not the request's fault: it gets pageable memory, and the
    pool stops asking for more pinned memory than it holds."""
    calls = []

    def failing(nbytes: int) -> np.ndarray:
        calls.append(nbytes)
        raise MemoryError("cudaHostAlloc failed")

    pool = HostBufferPool(pinned_limit=1 << 20, pinned_allocator=failing)
    with caplog.at_level(logging.WARNING, logger="server.memory.host_pool"):
        buffer = pool.acquire(10)
    assert not buffer.pinned and len(buffer.view) == 10
    assert "pinned allocation of 65536 bytes failed" in caplog.text
    stats = pool.stats()
    assert (stats.pinned_total, stats.pinned_used, stats.pageable_used) == (0, 0, 1 << 16)
    assert stats.pageable_fallbacks == 1 and not pool.pins
    pool.acquire(10)
    assert len(calls) == 1, "no second try at pinning"


def test_steady_state_allocates_nothing() -> None:
    """10,000 requests of mixed sizes with a few in flight at once: after the first round no
    buffer is allocated, and nothing is left in use."""
    fake = FakePinned()
    pool = HostBufferPool(pinned_limit=64 << 20, pinned_allocator=fake)
    sizes = [200, 70_000, 1 << 20, 3 << 20]
    for round_ in range(2_500):
        held = [pool.acquire(size) for size in sizes]
        for buffer in held:
            buffer.release()
        if round_ == 0:
            warm = pool.stats().allocations
    stats = pool.stats()
    assert stats.allocations == warm == len(sizes)
    assert stats.reuses == 4 * 2_500 - len(sizes)
    assert stats.pinned_used == 0 and stats.pageable_used == 0
    assert fake.calls == len(sizes)
