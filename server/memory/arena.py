"""A shared-memory arena for request bodies, a buddy allocator over it, and a pool of its blocks.

With front-end processes, a front end receives each request body straight into a block of an
arena that the executor maps too, and only the block's offset crosses the Unix socket: one host
copy per byte (socket -> arena), and with CUDA one DMA from the arena, which the executor
registers once (``server.cuda.host_register``).

- ``Arena``: an anonymous ``memfd_create`` region, mapped ``MAP_SHARED`` and pre-faulted once
  at start (first-touch writes into fresh shared pages are an order of magnitude slower than
  warm ones). A memfd is not a file in ``/dev/shm``, so Docker's 64 MB ``/dev/shm`` does not
  bound it. Its size is sealed: no process can shrink it under another's mapping (which would
  turn reads into SIGBUS). Other processes ``attach`` the fd they get over ``SCM_RIGHTS`` or
  inherit.
- ``ArenaAllocator``: power-of-two blocks, page aligned, split on allocation and coalesced with
  their buddy on free; O(log size) per operation, thread-safe. Small blocks freed are kept
  for the next allocation of their size, up to a few of each, instead of being coalesced.
- ``ArenaPool``: what the transports take from ``HostBufferPool`` (``BufferSource``), handing
  out arena blocks; a full arena is a 503 before any byte of the body is stored.
"""

from __future__ import annotations

import fcntl
import mmap
import operator
import os
import threading
from typing import Self, SupportsIndex

import numpy as np

from server.errors import Unavailable

PAGE = mmap.PAGESIZE
_NAME = "tensorgate-arena"
_CHUNKED_START = 1 << 16  # what a chunked body's first buffer holds (server.http.body)


def _round_to_pages(size: int) -> int:
    return -(-size // PAGE) * PAGE


class Arena:
    """A ``MAP_SHARED`` memfd mapping of ``size`` bytes (a whole number of pages).

    ``view`` and ``array`` export the mapping's buffer. An ``mmap`` cannot be unmapped while
    any export lives (``mmap.close`` raises ``BufferError``), so ``close()`` closes the fd and
    unmaps when it can; where views still live (a response being written, a traceback), it
    drops the arena's references and the pages stay mapped until the last view is gone. With
    CUDA, unregister the arena (``server.cuda.host_register``) before closing it.
    """

    __slots__ = ("_address", "_array", "_closed", "_fd", "_mmap", "_size", "_whole", "writable")

    def __init__(self, fd: int, size: int, writable: bool) -> None:
        """Map ``size`` bytes of ``fd``, pre-faulted (``MAP_POPULATE``); use ``create`` or
        ``attach``. Takes over ``fd``."""
        self._fd = fd
        self._size = size
        self.writable = writable
        self._closed = False
        prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
        flags = mmap.MAP_SHARED | mmap.MAP_POPULATE
        self._mmap: mmap.mmap | None = mmap.mmap(fd, size, flags=flags, prot=prot)
        self._whole: memoryview | None = memoryview(self._mmap)
        self._array: np.ndarray | None = np.frombuffer(self._mmap, dtype=np.uint8)
        self._address = int(self._array.ctypes.data)

    @classmethod
    def create(cls, size: int) -> Arena:
        """A new writable arena of ``size`` bytes rounded up to whole pages, zero-filled."""
        if size <= 0:
            raise ValueError(f"an arena needs a positive size, not {size}")
        size = _round_to_pages(size)
        fd = os.memfd_create(_NAME, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            fcntl.fcntl(
                fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
            )
            return cls(fd, size, writable=True)
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, fd: int, size: int, writable: bool) -> Arena:
        """Map an arena another process created, from its fd (received over ``SCM_RIGHTS`` or
        inherited). The arena takes over ``fd`` and closes it in ``close()``; on failure the
        fd is left to the caller."""
        if size <= 0 or size % PAGE:
            raise ValueError(f"an arena's size is a positive number of pages, not {size}")
        actual = os.fstat(fd).st_size
        if actual < size:
            raise ValueError(f"the arena fd holds {actual} bytes, fewer than the {size} expected")
        return cls(fd, size, writable=writable)

    @property
    def fd(self) -> int:
        return self._fd

    @property
    def size(self) -> int:
        return self._size

    @property
    def address(self) -> int:
        """The mapping's address in this process (for ``cudaHostRegister``)."""
        return self._address

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def array(self) -> np.ndarray:
        """The whole mapping as a uint8 array (read-only when attached read-only)."""
        if self._array is None:
            raise ValueError("the arena is closed")
        return self._array

    def view(self, offset: SupportsIndex, nbytes: SupportsIndex) -> memoryview:
        """``nbytes`` of the arena from ``offset``. A descriptor that does not lie inside the
        arena (from a confused or hostile peer) is a ``ValueError``, for one request to fail."""
        whole = self._whole
        if whole is None:
            raise ValueError("the arena is closed")
        try:
            start, length = operator.index(offset), operator.index(nbytes)
        except TypeError:
            start = length = -1
        if start < 0 or length < 0 or start + length > self._size:
            raise ValueError(
                f"arena range of {nbytes!r} bytes at offset {offset!r} is outside the "
                f"{self._size}-byte arena"
            )
        return whole[start : start + length]

    def close(self) -> None:
        """Close the fd and unmap (once no view lives: see the class). Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._array = None
        whole, self._whole = self._whole, None
        mapping, self._mmap = self._mmap, None
        if whole is not None:
            try:
                whole.release()
            except BufferError:  # arrays made from it live on; they keep it
                pass
        if mapping is not None:
            try:
                mapping.close()
            except BufferError:  # views live on: unmapped when the last one is gone
                pass
        os.close(self._fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: Blocks of the smallest orders (up to ``min_block << (KEPT_ORDERS - 1)``: 64 KiB of 4 KiB
#: pages) that ``free`` keeps for the next ``allocate`` of their order, up to ``KEPT_BLOCKS``
#: of each, instead of merging them with their buddies. A small request's body took its block
#: by splitting the arena down through every order (16 in a 128 MiB arena) and gave it back by
#: merging all the way up: 4.5 us per allocation and release on an idle arena (1.9 us with 8
#: small blocks held), 1.0 us with a kept one.
KEPT_ORDERS = 5
KEPT_BLOCKS = 16


class ArenaAllocator:
    """A buddy allocator over offsets ``[0, size)``: blocks of ``min_block`` times a power of
    two, each aligned to its own size, split on allocation and merged with their free buddy
    on release. ``size`` is used down to a multiple of ``min_block``; one that is not a power
    of two starts as a few top-level blocks (its binary digits), which never merge.

    Small blocks released are kept (``KEPT_ORDERS``, ``KEPT_BLOCKS``) for the next allocation
    of their size; they count as free. When no block fits, the kept ones are merged back first
    and the allocation tried again, so keeping them never makes an allocation fail.

    Every operation takes the lock for a few set and dict operations: O(log size), callable
    from any thread. The lock is reentrant and the state is consistent between any two of
    those operations, so a release from a finalizer that the garbage collector runs inside an
    allocation on the same thread is safe.
    """

    def __init__(self, size: int, min_block: int = PAGE) -> None:
        if min_block <= 0 or min_block & (min_block - 1):
            raise ValueError(f"min_block must be a power of two, not {min_block}")
        if size < min_block:
            raise ValueError(f"an allocator of {size} bytes holds no {min_block}-byte block")
        self._min = min_block
        self._shift = min_block.bit_length() - 1
        self._size = size - size % min_block
        units = self._size >> self._shift
        self._orders = units.bit_length()  # order k: blocks of min_block << k bytes
        self._free: list[set[int]] = [set() for _ in range(self._orders)]
        # free blocks of the small orders, not merged (see KEPT_ORDERS)
        self._kept: list[list[int]] = [[] for _ in range(min(KEPT_ORDERS, self._orders))]
        self._used: dict[int, int] = {}  # offset -> order
        self._in_use = 0
        self._lock = threading.RLock()
        offset = 0
        for order in reversed(range(self._orders)):
            if units >> order & 1:
                self._free[order].add(offset)
                offset += min_block << order

    @property
    def size(self) -> int:
        """The bytes under management (``size`` down to a multiple of ``min_block``)."""
        return self._size

    @property
    def min_block(self) -> int:
        return self._min

    @property
    def bytes_in_use(self) -> int:
        """Bytes of the blocks handed out (whole blocks, not the sizes asked for)."""
        return self._in_use

    @property
    def blocks_in_use(self) -> int:
        return len(self._used)

    @property
    def largest_free(self) -> int:
        """The largest block that ``allocate`` could hand out now (0 when full)."""
        with self._lock:
            self._merge_kept()
            for order in reversed(range(self._orders)):
                if self._free[order]:
                    return self._min << order
        return 0

    def block_size(self, nbytes: int) -> int:
        """The size of the block that ``allocate(nbytes)`` hands out."""
        return self._min << self._order(nbytes)

    def _order(self, nbytes: int) -> int:
        units = (max(nbytes, 1) + self._min - 1) >> self._shift
        return (units - 1).bit_length()

    def allocate(self, nbytes: int) -> int | None:
        """The offset of a free block of at least ``nbytes``, None when none fits now."""
        need = self._order(nbytes)
        with self._lock:
            if need < len(self._kept) and self._kept[need]:
                offset = self._kept[need].pop()
            else:
                found = self._split(need)
                if found is None and any(self._kept):
                    self._merge_kept()
                    found = self._split(need)
                if found is None:
                    return None
                offset = found
            self._used[offset] = need
            self._in_use += self._min << need
            return offset

    def _split(self, need: int) -> int | None:
        """Take a block of order ``need`` from the free sets, splitting a larger one."""
        for order in range(need, self._orders):
            free = self._free[order]
            if free:
                break
        else:
            return None
        offset = free.pop()
        while order > need:  # split: keep the lower half, free the upper
            order -= 1
            self._free[order].add(offset + (self._min << order))
        return offset

    def free(self, offset: int) -> None:
        """Release the block at ``offset``; ``ValueError`` when none is allocated there."""
        with self._lock:
            order = self._used.pop(offset, None)
            if order is None:
                raise ValueError(f"no allocated arena block at offset {offset!r} (freed twice?)")
            self._in_use -= self._min << order
            if order < len(self._kept) and len(self._kept[order]) < KEPT_BLOCKS:
                self._kept[order].append(offset)
                return
            self._merge(offset, order)

    def _merge_kept(self) -> None:
        for order, kept in enumerate(self._kept):
            while kept:
                self._merge(kept.pop(), order)

    def _merge(self, offset: int, order: int) -> None:
        """Give the free block back to the free sets, merged with its free buddies."""
        while order < self._orders - 1:
            block = self._min << order
            buddies = self._free[order]
            buddy = offset ^ block
            if buddy not in buddies:
                break
            buddies.remove(buddy)
            offset &= ~block
            order += 1
        self._free[order].add(offset)

    def capacity(self, offset: int) -> int:
        """The size of the allocated block at ``offset`` (``ValueError`` when none is)."""
        order = self._used.get(offset)
        if order is None:
            raise ValueError(f"no allocated arena block at offset {offset!r}")
        return self._min << order

    def free_blocks(self) -> list[tuple[int, int]]:
        """Every free block as ``(offset, size)``, by offset (for tests and diagnostics)."""
        with self._lock:
            self._merge_kept()
            return sorted(
                (offset, self._min << order)
                for order, offsets in enumerate(self._free)
                for offset in offsets
            )


class ArenaBuffer:
    """A block of the arena, as ``HostBuffer``: ``view`` is sized to the request, ``offset``
    is where the block starts in the arena (what crosses to the executor), and ``release()``
    frees the block once."""

    __slots__ = ("_block", "_pool", "_released", "offset", "view")
    #: Not to this process: the front end that holds it never copies to a GPU (the executor
    #: registers the whole arena as pinned for its own copies).
    pinned = False

    def __init__(self, pool: ArenaPool, offset: int, block: memoryview, nbytes: int) -> None:
        self._pool = pool
        self._block = block
        self._released = False
        self.offset = offset
        self.view = block[:nbytes]

    @property
    def capacity(self) -> int:
        return len(self._block)

    def resize(self, nbytes: int) -> None:
        """Make ``view`` cover ``nbytes`` of the block (at most its capacity)."""
        if nbytes > self.capacity:
            raise ValueError(f"{nbytes} bytes exceed the buffer's {self.capacity}")
        self.view = self._block[:nbytes]

    def release(self) -> None:
        """Free the block; safe to call more than once. Views of it may outlive this (they
        are never read again once the request is answered), as with ``HostBuffer``."""
        if self._released:
            return
        self._released = True
        self._pool._give_back(self.offset)


class ArenaPool:
    """Request-body buffers from an arena's blocks: a ``BufferSource``, as ``HostBufferPool``.
    When no block fits, either because the arena is busy or because the request is larger
    than the arena can ever hold, ``acquire`` raises ``Unavailable`` (503) before any byte is
    stored."""

    def __init__(self, arena: Arena) -> None:
        self._allocator = ArenaAllocator(arena.size)
        self._whole = arena.view(0, arena.size)

    @property
    def allocator(self) -> ArenaAllocator:
        return self._allocator

    @property
    def bytes_in_use(self) -> int:
        """Bytes of the blocks handed out and not yet released."""
        return self._allocator.bytes_in_use

    def footprint(self, nbytes: int | None) -> int:
        """The bytes a buffer for ``nbytes`` takes (its block; chunked bodies start at 64
        KiB)."""
        return self._allocator.block_size(_CHUNKED_START if nbytes is None else nbytes)

    def acquire(self, nbytes: int) -> ArenaBuffer:
        """A block of at least ``nbytes``, or ``Unavailable`` when none fits now."""
        offset = self._allocator.allocate(nbytes)
        if offset is None:
            block = self._allocator.block_size(nbytes)
            if block > self._allocator.size:
                raise Unavailable(
                    f"a {nbytes}-byte request body does not fit in the server's "
                    f"{self._allocator.size}-byte request-body arena"
                )
            raise Unavailable(
                f"the server is busy: no free {block}-byte block in the request-body arena "
                f"({self._allocator.bytes_in_use} of {self._allocator.size} bytes in use); "
                "retry later"
            )
        capacity = self._allocator.capacity(offset)
        return ArenaBuffer(self, offset, self._whole[offset : offset + capacity], nbytes)

    def _give_back(self, offset: int) -> None:
        self._allocator.free(offset)
