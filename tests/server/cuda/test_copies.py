"""The GPU path's copies against the CuPy stand-in: outputs fetched into the host pool, or
into the memory a request's run was offered.

An output's host copy is a buffer of the server's pool (pinned where there is CUDA), counted
in its statistics while any view of it lives (a batch's per-request rows, a response being
written) and back in the pool, for the next output, once none does. A request run alone in
the executor process offers blocks of its front end's result arena instead: a large output is
copied there, and nowhere else.
"""

from __future__ import annotations

import gc

import ml_dtypes
import numpy as np

from server.cuda.copies import (
    c_contiguous,
    fetch,
    fill,
    joined_on_host,
    joined_shape,
    storage_dtype,
)
from server.ipc.tensors import LentBlocks, Outbox
from server.memory.arena import ArenaAllocator
from server.memory.host_pool import HostBufferPool
from tests.fake_cupy import FakeCupy


def _lent(arena_bytes: int) -> tuple[LentBlocks, Outbox, ArenaAllocator]:
    """Blocks of a result arena of ``arena_bytes``, as the executor lends them to a run."""
    allocator = ArenaAllocator(arena_bytes)
    outbox = Outbox(np.zeros(arena_bytes, np.uint8), allocator.allocate)
    return LentBlocks(outbox, allocator.free), outbox, allocator


def test_an_output_is_fetched_into_a_pool_buffer_held_while_any_view_lives() -> None:
    fake = FakeCupy()
    stream = fake.cuda.Stream(non_blocking=True)
    pool = HostBufferPool()
    values = np.arange(4 * 4096, dtype=np.float32).reshape(4, 4096)  # 64 KiB: pooled
    device = fake.device_array(values)
    fake.events.clear()
    host = fetch(device, np.dtype(np.float32), stream, pool)
    assert fake.events == ["to host"]
    np.testing.assert_array_equal(host, values)
    assert pool.bytes_in_use == 1 << 16
    rows = [host[:1], host[1:]]  # what scatter hands each request
    del host
    gc.collect()
    assert pool.bytes_in_use == 1 << 16, "the requests' rows still point into it"
    written = memoryview(rows[1])  # type: ignore[arg-type]  # a transport writing one of them
    del rows
    gc.collect()
    assert pool.bytes_in_use == 1 << 16
    del written
    gc.collect()
    assert pool.bytes_in_use == 0
    again = fetch(device, np.dtype(np.float32), stream, pool)
    assert pool.stats().reuses == 1 and pool.stats().allocations == 1
    del again


def test_a_large_output_is_fetched_into_the_memory_offered_not_the_pool() -> None:
    fake = FakeCupy()
    pool = HostBufferPool()
    lent, outbox, allocator = _lent(1 << 20)
    values = np.arange(4 * 4096, dtype=np.float32).reshape(4, 4096)
    device, stream = fake.device_array(values), fake.cuda.Stream()
    fake.events.clear()
    host = fetch(device, np.dtype(np.float32), stream, pool, lent)
    assert fake.events == ["to host"], "one copy, from the device"
    np.testing.assert_array_equal(host, values)
    assert outbox.offset_of(host) is not None, "in the arena, where the front end reads it"
    assert allocator.bytes_in_use == values.nbytes
    assert pool.stats().allocations == 0
    lent.reclaim()  # (not handed over: the request failed, say)
    assert allocator.bytes_in_use == 0


def test_without_room_in_the_memory_offered_an_output_goes_to_the_pool() -> None:
    fake = FakeCupy()
    pool = HostBufferPool()
    lent, outbox, _ = _lent(1 << 16)
    values = np.ones((2, 16384), dtype=np.float32)  # 128 KiB: more than the arena holds
    host = fetch(fake.device_array(values), np.dtype(np.float32), fake.cuda.Stream(), pool, lent)
    np.testing.assert_array_equal(host, values)
    assert outbox.offset_of(host) is None and pool.bytes_in_use == 1 << 17
    del host


def test_small_outputs_are_neither_pooled_nor_put_in_the_memory_offered() -> None:
    fake = FakeCupy()
    pool = HostBufferPool()
    lent, _, allocator = _lent(1 << 20)
    host = fetch(fake.device_array(np.ones(3, np.float32)), np.dtype(np.float32), None, pool,
                 lent)
    np.testing.assert_array_equal(host, [1, 1, 1])
    assert allocator.bytes_in_use == 0 and pool.stats().allocations == 0


def test_small_outputs_are_not_pooled() -> None:
    fake = FakeCupy()
    pool = HostBufferPool()
    host = fetch(fake.device_array(np.ones(3, np.float32)), np.dtype(np.float32), None, pool)
    np.testing.assert_array_equal(host, [1, 1, 1])
    assert pool.stats().allocations == 0


def test_bf16_comes_back_from_its_uint16_storage() -> None:
    fake = FakeCupy()
    values = np.array([1.5, -2.0, 3.0], dtype=ml_dtypes.bfloat16)
    assert storage_dtype(values.dtype) == np.uint16
    device = fake.device_array(values.view(np.uint16))
    host = fetch(device, values.dtype, fake.cuda.Stream(), HostBufferPool())
    assert host.dtype == values.dtype
    np.testing.assert_array_equal(host, values)


def test_parts_fill_their_rows_and_join_on_the_host() -> None:
    fake = FakeCupy()
    parts = [np.ones((2, 2), np.float32), fake.device_array(np.zeros((1, 2), np.float32))]
    assert joined_shape(parts) == (3, 2) and joined_shape(parts[:1]) == (2, 2)
    target = fake.empty((3, 2), np.float32)
    fill(fake, target, parts, fake.cuda.Stream())
    np.testing.assert_array_equal(target.host, [[1, 1], [1, 1], [0, 0]])
    np.testing.assert_array_equal(joined_on_host(parts), target.host)
    assert joined_on_host(parts[:1]) is parts[0]


def test_scalars_and_strided_parts_keep_their_shape() -> None:
    """A 0-d input (a non-batching model's scalar) stays 0-d; a strided part is copied in C
    order first, on the stream."""
    fake = FakeCupy()
    stream = fake.cuda.Stream()
    scalar = fake.empty((), np.float32)
    fill(fake, scalar, [np.array(2.5, np.float32)], stream)
    assert scalar.host.shape == () and float(scalar.host) == 2.5
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    target = fake.empty((3, 2), np.float32)
    fill(fake, target, [strided], stream)
    np.testing.assert_array_equal(target.host, strided)
    assert c_contiguous(np.array(1.0)).shape == ()
