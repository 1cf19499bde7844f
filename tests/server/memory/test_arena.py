"""The shared arena: a memfd mapping other processes attach, its buddy allocator, its pool."""

from __future__ import annotations

import fcntl
import os
import random
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server.errors import Unavailable
from server.http.body import BodyReceiver, admit
from server.memory.arena import PAGE, Arena, ArenaAllocator, ArenaPool
from server.memory.host_pool import BufferSource, HostBufferPool

ROOT = Path(__file__).resolve().parents[3]
KIB = 1024
MIB = 1 << 20


@pytest.fixture
def arena() -> Iterator[Arena]:
    with Arena.create(1 * MIB) as made:
        yield made


# --- Arena ----------------------------------------------------------------------------------


def test_an_arena_is_a_sealed_memfd_of_whole_zeroed_pages() -> None:
    with Arena.create(PAGE + 1) as made:
        assert made.size == 2 * PAGE
        assert made.writable
        assert os.readlink(f"/proc/self/fd/{made.fd}").startswith("/memfd:tensorgate-arena")
        assert not os.get_inheritable(made.fd), "MFD_CLOEXEC: children get it only if passed"
        assert os.fstat(made.fd).st_size == made.size
        seals = fcntl.fcntl(made.fd, fcntl.F_GET_SEALS)
        assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW
        with pytest.raises(PermissionError):  # no peer can cut the pages from under the others
            os.ftruncate(made.fd, PAGE)
        assert made.array.shape == (made.size,) and made.array.dtype == np.uint8
        assert not made.array.any()
        assert made.address == made.array.ctypes.data and made.address % PAGE == 0


@pytest.mark.parametrize("size", [0, -1])
def test_an_arena_needs_a_positive_size(size: int) -> None:
    with pytest.raises(ValueError):
        Arena.create(size)


def test_views_and_the_array_are_the_same_memory(arena: Arena) -> None:
    arena.view(PAGE, 5)[:] = b"hello"
    assert bytes(arena.array[PAGE : PAGE + 5]) == b"hello"
    arena.array[-3:] = [1, 2, 3]
    assert bytes(arena.view(arena.size - 3, 3)) == b"\x01\x02\x03"
    assert len(arena.view(0, arena.size)) == arena.size
    assert len(arena.view(arena.size, 0)) == 0
    assert len(arena.view(np.int64(8), np.uint32(4))) == 4  # descriptors may carry numpy ints


@pytest.mark.parametrize(
    ("offset", "nbytes"),
    [
        (-1, 1),
        (0, -1),
        (1 * MIB, 1),
        (1 * MIB - 1, 2),
        (1, 1 * MIB),
        (2**70, 1),
        (0, 2**64),
        (1.5, 1),
        ("0", 1),
        (0, None),
    ],
)
def test_a_descriptor_outside_the_arena_is_a_value_error(
    arena: Arena, offset: Any, nbytes: Any
) -> None:
    with pytest.raises(ValueError, match="outside the 1048576-byte arena"):
        arena.view(offset, nbytes)


def test_close_is_idempotent_and_leaves_live_views_readable() -> None:
    made = Arena.create(4 * PAGE)
    made.view(0, 4)[:] = b"kept"
    fd = made.fd
    live = made.view(0, 4)  # e.g. a response still being written
    rows = made.array[:4]
    made.close()
    made.close()
    assert made.closed
    with pytest.raises(OSError):
        os.fstat(fd)
    assert bytes(live) == b"kept" and bytes(rows) == b"kept"  # still mapped while they live
    with pytest.raises(ValueError, match="closed"):
        made.view(0, 1)
    with pytest.raises(ValueError, match="closed"):
        _ = made.array


def test_close_without_views_unmaps() -> None:
    made = Arena.create(PAGE)
    address = made.address
    made.close()
    assert made.closed
    mapped = [line.split()[0] for line in Path("/proc/self/maps").read_text().splitlines()]
    assert not any(int(r.split("-")[0], 16) <= address < int(r.split("-")[1], 16) for r in mapped)


def test_a_second_mapping_of_the_fd_shares_the_bytes(arena: Arena) -> None:
    with Arena.attach(os.dup(arena.fd), arena.size, writable=True) as peer:
        assert peer.address != arena.address
        peer.view(100, 3)[:] = b"abc"
        assert bytes(arena.view(100, 3)) == b"abc"


def test_a_read_only_attachment_cannot_write(arena: Arena) -> None:
    arena.view(0, 2)[:] = b"ro"
    with Arena.attach(os.dup(arena.fd), arena.size, writable=False) as peer:
        assert not peer.writable
        assert bytes(peer.view(0, 2)) == b"ro"
        assert peer.view(0, 2).readonly
        with pytest.raises(TypeError):
            peer.view(0, 2)[:] = b"no"
        assert not peer.array.flags.writeable


def test_attach_checks_the_size(arena: Arena) -> None:
    fd = os.dup(arena.fd)
    try:
        with pytest.raises(ValueError, match="fewer than"):
            Arena.attach(fd, arena.size + PAGE, writable=True)
        with pytest.raises(ValueError, match="number of pages"):
            Arena.attach(fd, PAGE + 1, writable=True)
        with pytest.raises(ValueError, match="number of pages"):
            Arena.attach(fd, 0, writable=True)
    finally:
        os.close(fd)  # a failed attach leaves the fd to its caller


def test_another_process_attaches_the_fd_and_its_writes_are_seen(arena: Arena) -> None:
    arena.view(0, 6)[:] = b"parent"
    child = textwrap.dedent(
        """
        import sys
        from server.memory.arena import Arena

        fd, size = int(sys.argv[1]), int(sys.argv[2])
        with Arena.attach(fd, size, writable=True) as arena:
            seen = bytes(arena.view(0, 6))
            arena.view(4096, 11)[:] = b"from child "
            arena.array[-1] = 0xAB
        print(seen.decode())
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", child, str(arena.fd), str(arena.size)],
        pass_fds=(arena.fd,),
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "parent"
    assert bytes(arena.view(4096, 11)) == b"from child "
    assert arena.array[-1] == 0xAB


# --- ArenaAllocator -------------------------------------------------------------------------


def test_a_fresh_allocator_is_one_free_block() -> None:
    allocator = ArenaAllocator(1 * MIB)
    assert allocator.free_blocks() == [(0, 1 * MIB)]
    assert allocator.largest_free == 1 * MIB
    assert allocator.bytes_in_use == 0 and allocator.blocks_in_use == 0
    assert allocator.allocate(1 * MIB) == 0, "the largest block is the whole arena"
    assert allocator.largest_free == 0
    assert allocator.allocate(1) is None
    allocator.free(0)
    assert allocator.free_blocks() == [(0, 1 * MIB)]


@pytest.mark.parametrize(
    ("nbytes", "block"),
    [(0, 4 * KIB), (1, 4 * KIB), (4 * KIB, 4 * KIB), (4 * KIB + 1, 8 * KIB), (100_000, 128 * KIB)],
)
def test_blocks_are_page_multiples_of_a_power_of_two(nbytes: int, block: int) -> None:
    allocator = ArenaAllocator(1 * MIB)
    offset = allocator.allocate(nbytes)
    assert offset is not None
    assert allocator.capacity(offset) == block == allocator.block_size(nbytes)
    assert offset % block == 0
    assert allocator.bytes_in_use == block and allocator.blocks_in_use == 1


def test_a_block_larger_than_the_arena_never_fits() -> None:
    allocator = ArenaAllocator(64 * KIB)
    assert allocator.allocate(64 * KIB + 1) is None
    assert allocator.bytes_in_use == 0


def test_double_free_and_unknown_offsets_are_value_errors() -> None:
    allocator = ArenaAllocator(64 * KIB)
    offset = allocator.allocate(10)
    assert offset is not None
    allocator.free(offset)
    with pytest.raises(ValueError, match="freed twice"):
        allocator.free(offset)
    with pytest.raises(ValueError):
        allocator.free(123)
    with pytest.raises(ValueError):
        allocator.capacity(offset)
    second = allocator.allocate(8 * KIB)
    assert second is not None
    with pytest.raises(ValueError):
        allocator.free(second + 4 * KIB)  # inside a block is not a block
    assert allocator.blocks_in_use == 1


@pytest.mark.parametrize(
    ("size", "min_block"), [(64 * KIB, 3000), (64 * KIB, 0), (2 * KIB, 4 * KIB)]
)
def test_bad_geometry_is_refused(size: int, min_block: int) -> None:
    with pytest.raises(ValueError):
        ArenaAllocator(size, min_block)


def test_a_size_that_is_not_a_power_of_two_starts_as_its_binary_digits() -> None:
    allocator = ArenaAllocator(12 * 4 * KIB + 100)  # the 100 bytes past the last block go unused
    assert allocator.size == 48 * KIB
    assert allocator.free_blocks() == [(0, 32 * KIB), (32 * KIB, 16 * KIB)]
    assert allocator.allocate(48 * KIB) is None, "top-level blocks never merge"
    assert allocator.allocate(32 * KIB) == 0
    assert allocator.allocate(16 * KIB) == 32 * KIB
    assert allocator.allocate(1) is None
    allocator.free(0)
    allocator.free(32 * KIB)
    assert allocator.free_blocks() == [(0, 32 * KIB), (32 * KIB, 16 * KIB)]


def test_fragmentation_then_coalescing() -> None:
    allocator = ArenaAllocator(64 * KIB)
    offsets = [allocator.allocate(4 * KIB) for _ in range(16)]
    assert sorted(o for o in offsets if o is not None) == list(range(0, 64 * KIB, 4 * KIB))
    assert allocator.allocate(1) is None
    for offset in offsets[::2]:
        assert offset is not None
        allocator.free(offset)
    # Half the arena is free, but only in single pages: no two free pages are buddies.
    assert allocator.bytes_in_use == 32 * KIB
    assert allocator.largest_free == 4 * KIB
    assert allocator.allocate(8 * KIB) is None
    for offset in offsets[1::2]:
        assert offset is not None
        allocator.free(offset)
    assert allocator.free_blocks() == [(0, 64 * KIB)]


def _check_layout(allocator: ArenaAllocator, live: dict[int, int]) -> None:
    """Live blocks and free blocks tile [0, size) exactly: no overlap, no leak."""
    pieces = sorted([(o, allocator.capacity(o)) for o in live] + allocator.free_blocks())
    position = 0
    for offset, size in pieces:
        assert offset == position, (offset, position)
        assert offset % size == 0, "every block is aligned to its size"
        position += size
    assert position == allocator.size
    assert allocator.bytes_in_use == sum(allocator.capacity(o) for o in live)
    assert allocator.blocks_in_use == len(live)


def test_small_blocks_freed_are_kept_for_their_size_and_never_make_an_allocation_fail() -> None:
    """A small block freed goes to the next allocation of its size (no split and merge through
    every order); it counts as free; and when a larger block is needed, the kept ones are
    merged back first."""
    allocator = ArenaAllocator(1 * MIB)
    first = allocator.allocate(100)
    assert first is not None
    allocator.free(first)
    assert allocator.bytes_in_use == 0 and allocator.blocks_in_use == 0
    assert allocator.allocate(100) == first
    allocator.free(first)
    pages = [allocator.allocate(PAGE) for _ in range(MIB // PAGE)]  # the whole arena
    assert None not in pages and allocator.allocate(1) is None
    for offset in pages:
        assert offset is not None
        allocator.free(offset)
    assert allocator.allocate(1 * MIB) == 0  # the kept pages merged back on the way
    allocator.free(0)
    assert allocator.free_blocks() == [(0, 1 * MIB)]


@pytest.mark.parametrize("seed", range(8))
def test_random_sequences_never_overlap_and_coalesce_back_to_whole(seed: int) -> None:
    rng = random.Random(seed)
    size = rng.choice([1 * MIB, 1 * MIB + 12 * PAGE])
    allocator = ArenaAllocator(size)
    initial = allocator.free_blocks()
    live: dict[int, int] = {}  # offset -> bytes asked for
    offset: int | None
    for step in range(3000):
        if live and (rng.random() < 0.45 or allocator.largest_free == 0):
            offset = rng.choice(list(live))
            del live[offset]
            allocator.free(offset)
        else:
            nbytes = int(rng.expovariate(1 / 20_000))
            offset = allocator.allocate(nbytes)
            if offset is None:
                assert allocator.largest_free < allocator.block_size(nbytes)
                continue
            assert offset not in live
            assert allocator.capacity(offset) >= nbytes
            assert offset + allocator.capacity(offset) <= allocator.size
            live[offset] = nbytes
        if step % 50 == 0:
            _check_layout(allocator, live)
    _check_layout(allocator, live)
    for offset in rng.sample(list(live), len(live)):
        allocator.free(offset)
    assert allocator.bytes_in_use == 0 and allocator.blocks_in_use == 0
    assert allocator.free_blocks() == initial


def test_threads_allocating_and_freeing_leave_it_whole() -> None:
    allocator = ArenaAllocator(4 * MIB)
    failures: list[BaseException] = []

    def work(seed: int) -> None:
        rng = random.Random(seed)
        mine: list[int] = []
        try:
            for _ in range(2000):
                if mine and rng.random() < 0.5:
                    allocator.free(mine.pop(rng.randrange(len(mine))))
                else:
                    offset = allocator.allocate(rng.randrange(1, 64 * KIB))
                    if offset is not None:
                        mine.append(offset)
            for offset in mine:
                allocator.free(offset)
        except BaseException as exc:  # noqa: BLE001 - reported by the main thread
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(seed,)) for seed in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
    assert allocator.free_blocks() == [(0, 4 * MIB)]


# --- ArenaPool ------------------------------------------------------------------------------


def test_a_pool_buffer_is_a_block_of_the_arena(arena: Arena) -> None:
    pool = ArenaPool(arena)
    buffer = pool.acquire(10_000)
    assert len(buffer.view) == 10_000 and buffer.capacity == 16 * KIB
    buffer.view[:4] = b"body"
    assert bytes(arena.view(buffer.offset, 4)) == b"body"
    other = pool.acquire(10_000)
    assert abs(other.offset - buffer.offset) >= 16 * KIB
    assert pool.bytes_in_use == 32 * KIB
    buffer.resize(16 * KIB)
    assert len(buffer.view) == 16 * KIB
    buffer.resize(3)
    assert bytes(buffer.view) == b"bod"
    with pytest.raises(ValueError, match="exceed"):
        buffer.resize(16 * KIB + 1)
    buffer.release()
    buffer.release()
    other.release()
    assert pool.bytes_in_use == 0
    assert pool.allocator.free_blocks() == [(0, arena.size)]


def test_a_full_arena_is_unavailable_before_anything_is_stored(arena: Arena) -> None:
    pool = ArenaPool(arena)
    held = pool.acquire(512 * KIB)
    half = pool.acquire(256 * KIB)
    with pytest.raises(Unavailable, match="busy: no free 524288-byte block") as busy:
        pool.acquire(300 * KIB)
    assert busy.value.http_status == 503
    with pytest.raises(Unavailable, match="does not fit in the server's 1048576-byte"):
        pool.acquire(1 * MIB + 1)
    assert pool.bytes_in_use == 768 * KIB
    held.release()
    pool.acquire(300 * KIB).release()
    half.release()


def test_footprint_is_the_block_a_body_takes(arena: Arena) -> None:
    pool = ArenaPool(arena)
    assert pool.footprint(1) == 4 * KIB
    assert pool.footprint(100_000) == 128 * KIB
    assert pool.footprint(None) == 64 * KIB, "a chunked body starts with 64 KiB"
    assert HostBufferPool.footprint(None) == 64 * KIB


def test_the_body_receiver_takes_an_arena_pool(arena: Arena) -> None:
    pool: BufferSource = ArenaPool(arena)
    fixed = BodyReceiver(pool, limit=1 * MIB, content_length=10, budget=1 * MIB)
    fixed.feed(b"01234")
    fixed.feed(b"56789")
    assert bytes(fixed.body()) == b"0123456789"
    fixed.release()
    chunked = BodyReceiver(pool, limit=1 * MIB, content_length=None, budget=1 * MIB)
    payload = bytes(range(256)) * 1000  # 256 000 bytes: grows past the first 64 KiB block
    for start in range(0, len(payload), 50_000):
        chunked.feed(payload[start : start + 50_000])
    assert bytes(chunked.body()) == payload
    assert pool.bytes_in_use == 256 * KIB
    chunked.release()
    assert pool.bytes_in_use == 0
    admit(pool, 1 * MIB, 1 * MIB)
    with pytest.raises(Unavailable):
        admit(pool, 1 * MIB + 1, 1 * MIB)


def test_both_pools_are_buffer_sources(arena: Arena) -> None:
    sources: list[BufferSource] = [HostBufferPool(pinned_allocator=None), ArenaPool(arena)]
    for source in sources:
        buffer = source.acquire(100)
        assert len(buffer.view) == 100 and buffer.capacity >= 100
        buffer.release()
        assert source.bytes_in_use == 0
