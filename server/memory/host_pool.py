"""Reusable host buffers for request bodies and gRPC inputs, in power-of-two size classes.

Request bytes are streamed into a buffer from this pool and tensors are numpy views of it, so
a buffer goes back to the pool only after the response that used it has been written. With
CUDA the buffers are pinned (page-locked) memory from CuPy, so host-to-device copies are true
asynchronous DMA; pinned memory is a scarce, system-wide resource, so the pool allocates at
most ``pinned_limit`` bytes of it (``--pinned-memory-pool-byte-size``, Triton's 256 MiB) and
keeps every pinned buffer for reuse. Past that budget, and always without CUDA, buffers are
page-aligned pageable numpy memory, of which at most ``max_cached_bytes`` are kept free.
The counters (``stats()``) show steady state: no allocation once the size classes are warm.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from server.cuda.devices import cupy_module

log = logging.getLogger(__name__)

PAGE = 4096
_MIN_CLASS = 1 << 16  # 64 KiB: smaller bodies share one class
_WARN_EVERY_S = 60.0  # how often the "pinned budget exhausted" warning may repeat

#: Allocates ``nbytes`` of pinned memory as a uint8 array (which keeps the memory alive).
PinnedAllocator = Callable[[int], np.ndarray]


def size_class(nbytes: int, minimum: int = _MIN_CLASS) -> int:
    """The power of two at or above ``nbytes`` (and ``minimum``) that holds it."""
    return max(minimum, 1 << (max(nbytes, 1) - 1).bit_length())


def page_aligned(nbytes: int) -> np.ndarray:
    """A page-aligned uint8 array of ``nbytes`` (the alignment pinned copies want)."""
    raw = np.empty(nbytes + PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE
    return raw[start : start + nbytes]


def cupy_pinned_allocator() -> PinnedAllocator | None:
    """CuPy's pinned allocation (``cudaHostAlloc``, page-aligned) when CUDA is usable."""
    cupy = cupy_module()
    if cupy is None:
        return None

    def allocate(nbytes: int) -> np.ndarray:
        memory = cupy.cuda.alloc_pinned_memory(nbytes)
        # count=: CuPy's pinned pool may hand out a larger block than asked for.
        return np.frombuffer(memory, dtype=np.uint8, count=nbytes)

    return allocate


@dataclass(frozen=True)
class PoolStats:
    """Where the pool's memory is, and how often it had to allocate."""

    pinned_limit: int  # the pinned budget (0 without CUDA)
    pinned_total: int  # pinned bytes allocated (in use + free)
    pinned_used: int  # pinned bytes handed out now
    pageable_used: int  # pageable bytes handed out now
    cached_bytes: int  # free bytes kept for reuse (pinned and pageable)
    allocations: int  # buffers ever allocated
    reuses: int  # acquisitions served from the free lists
    pageable_fallbacks: int  # pinned wanted, pageable given (budget exhausted)


class PooledBuffer(Protocol):
    """What a transport holds a request body or raw inputs in: ``HostBuffer``, or an arena
    block (``server.memory.arena.ArenaBuffer``)."""

    view: memoryview  # the bytes asked for (or set by ``resize``)

    @property
    def pinned(self) -> bool:
        """Page-locked for this process's CUDA copies (no further pinned copy is needed)."""
        ...

    @property
    def capacity(self) -> int: ...

    def resize(self, nbytes: int) -> None: ...

    def release(self) -> None: ...


class BufferSource(Protocol):
    """Where transports take those buffers from: ``HostBufferPool`` in one process, an
    ``ArenaPool`` in a front end."""

    @property
    def bytes_in_use(self) -> int: ...

    def footprint(self, nbytes: int | None) -> int: ...

    def acquire(self, nbytes: int) -> PooledBuffer: ...


class HostBuffer:
    """A pooled buffer; ``view`` is sized to the request, ``release()`` returns it once."""

    __slots__ = ("_array", "_pool", "_released", "pinned", "view")

    def __init__(
        self, pool: HostBufferPool | None, array: np.ndarray, nbytes: int, pinned: bool = False
    ) -> None:
        self._pool = pool
        self._array = array
        self.pinned = pinned
        self.view = array.data[:nbytes]
        self._released = False

    @property
    def capacity(self) -> int:
        return int(self._array.nbytes)

    def resize(self, nbytes: int) -> None:
        """Make ``view`` cover ``nbytes`` of the buffer (at most its capacity)."""
        if nbytes > self.capacity:
            raise ValueError(f"{nbytes} bytes exceed the buffer's {self.capacity}")
        self.view = self._array.data[:nbytes]

    def release(self) -> None:
        """Hand the memory back; safe to call more than once."""
        if self._released:
            return
        self._released = True
        # Views of this memory may outlive the request (tracebacks, logs); they are never read
        # again once the response is written, so the memory can be reused.
        if self._pool is not None:
            self._pool._give_back(self._array, self.pinned)


class HostBufferPool:
    """Pinned buffers within a budget when CUDA is present, page-aligned pageable ones else."""

    def __init__(
        self,
        max_cached_bytes: int = 256 << 20,
        pinned_limit: int = 256 << 20,
        pinned_allocator: PinnedAllocator | None = None,
    ) -> None:
        """``pinned_allocator`` defaults to CuPy's when CUDA is usable (else no pinning)."""
        self._max_cached = max_cached_bytes
        self._allocate_pinned = pinned_allocator or cupy_pinned_allocator()
        self._pinned_limit = pinned_limit if self._allocate_pinned is not None else 0
        self._free: dict[tuple[int, bool], list[np.ndarray]] = {}
        # GPU output buffers are released by finalizers (server.cuda.copies), which the garbage
        # collector may run inside any allocation on any thread: the lock is reentrant (the
        # pool's own allocations), and nothing waits for another lock while holding it (the
        # pool logs after releasing it), so a finalizer on a thread that holds, say, a logging
        # lock cannot deadlock with this pool.
        self._lock = threading.RLock()
        self._cached = 0
        self._pinned_total = 0
        self._pinned_used = 0
        self._pageable_used = 0
        self._allocations = 0
        self._reuses = 0
        self._fallbacks = 0
        self._warned_at: float | None = None

    @property
    def pins(self) -> bool:
        """Whether this pool hands out pinned memory at all."""
        return self._pinned_limit > 0

    @property
    def cached_bytes(self) -> int:
        return self._cached

    @staticmethod
    def footprint(nbytes: int | None) -> int:
        """The bytes a buffer for ``nbytes`` takes (its size class; chunked bodies start at
        the smallest)."""
        return size_class(nbytes or 0)

    @property
    def bytes_in_use(self) -> int:
        """Bytes handed out and not yet released (pinned and pageable)."""
        return self._pinned_used + self._pageable_used

    def stats(self) -> PoolStats:
        with self._lock:
            return PoolStats(
                self._pinned_limit,
                self._pinned_total,
                self._pinned_used,
                self._pageable_used,
                self._cached,
                self._allocations,
                self._reuses,
                self._fallbacks,
            )

    def acquire(self, nbytes: int) -> HostBuffer:
        """A buffer of at least ``nbytes``: a free one of its size class when there is one
        (pinned first), else a new pinned one within the budget, else a pageable one."""
        size = size_class(nbytes)
        warning: tuple[int, int] | None = None
        with self._lock:
            for pinned in (True, False):
                free = self._free.get((size, pinned))
                if free:
                    self._cached -= size
                    self._reuses += 1
                    self._count_out(size, pinned)
                    return HostBuffer(self, free.pop(), nbytes, pinned)
            pin = self._pinned_limit > 0 and self._pinned_total + size <= self._pinned_limit
            if pin:
                self._pinned_total += size  # reserved before allocating outside the lock
            elif self._pinned_limit > 0:
                self._fallbacks += 1
                warning = self._exhausted()
            self._allocations += 1
            self._count_out(size, pin)
        if warning is not None:  # logged outside the lock: see __init__
            log.warning(
                "pinned memory pool exhausted (%d of %d bytes in use): a %d-byte buffer is "
                "pageable memory instead; raise --pinned-memory-pool-byte-size if this repeats",
                *warning,
                size,
            )
        if pin:
            assert self._allocate_pinned is not None
            try:
                return HostBuffer(self, self._allocate_pinned(size), nbytes, pinned=True)
            except Exception as exc:  # noqa: BLE001 - cudaHostAlloc refused: serve pageable
                with self._lock:
                    self._pinned_total -= size
                    self._pinned_used -= size
                    self._pageable_used += size
                    self._fallbacks += 1
                    # Stop asking the driver for more than it could give.
                    self._pinned_limit = self._pinned_total
                log.warning(
                    "pinned allocation of %d bytes failed (%s): pageable memory from now on "
                    "beyond the %d pinned bytes held", size, exc, self._pinned_total,
                )
        return HostBuffer(self, page_aligned(size), nbytes)

    def array(self, nbytes: int) -> np.ndarray:
        """A buffer of ``nbytes`` as a uint8 array, for memory no one request releases (a
        batch's outputs, copies of shared memory inputs): it goes back to the pool when the
        last view of it is gone, after the responses that carry it have been written."""
        buffer = self.acquire(nbytes)
        # Every view of ``root`` (reshapes, a batch's per-request rows, the memoryviews the
        # transports write) keeps it alive, since its own base is not an array.
        root = np.frombuffer(buffer.view, dtype=np.uint8, count=nbytes)
        weakref.finalize(root, buffer.release).atexit = False
        return root

    def _count_out(self, size: int, pinned: bool) -> None:
        if pinned:
            self._pinned_used += size
        else:
            self._pageable_used += size

    def _exhausted(self) -> tuple[int, int] | None:
        """``(pinned bytes in use, budget)`` when the exhaustion warning is due (at most once
        a minute), else None; called with the lock held."""
        now = time.monotonic()
        if self._warned_at is None or now - self._warned_at >= _WARN_EVERY_S:
            self._warned_at = now
            return self._pinned_used, self._pinned_limit
        return None

    def _give_back(self, array: np.ndarray, pinned: bool) -> None:
        size = int(array.nbytes)
        with self._lock:
            if pinned:
                self._pinned_used -= size
            else:
                self._pageable_used -= size
            # Pinned buffers are bounded by the budget and always kept; pageable ones by the
            # cache bound.
            if pinned or self._cached + size <= self._max_cached:
                self._free.setdefault((size, pinned), []).append(array)
                self._cached += size
