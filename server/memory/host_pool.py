"""Reusable host buffers for request bodies, in power-of-two size classes.

Request bytes are streamed into a buffer from this pool and tensors are numpy views of it, so
a buffer goes back to the pool only after the response that used it has been written. Without
CUDA the buffers are page-aligned numpy memory; the CUDA data path issue hands out pinned
memory through the same interface.
"""

from __future__ import annotations

import threading

import numpy as np

PAGE = 4096
_MIN_CLASS = 1 << 16  # 64 KiB: smaller bodies share one class


def _size_class(nbytes: int) -> int:
    return max(_MIN_CLASS, 1 << (max(nbytes, 1) - 1).bit_length())


def _aligned(nbytes: int) -> np.ndarray:
    """A page-aligned uint8 array of ``nbytes`` (the alignment pinned copies want)."""
    raw = np.empty(nbytes + PAGE, dtype=np.uint8)
    start = -raw.ctypes.data % PAGE
    return raw[start : start + nbytes]


class HostBuffer:
    """A pooled buffer; ``view`` is sized to the request, ``release()`` returns it once."""

    __slots__ = ("_array", "_pool", "_released", "view")

    def __init__(self, pool: HostBufferPool | None, array: np.ndarray, nbytes: int) -> None:
        self._pool = pool
        self._array = array
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
            self._pool._give_back(self._array)


class HostBufferPool:
    """Keeps freed buffers per size class, up to ``max_cached_bytes`` in all."""

    def __init__(self, max_cached_bytes: int = 256 << 20) -> None:
        self._max_cached = max_cached_bytes
        self._cached = 0
        self._free: dict[int, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    @property
    def cached_bytes(self) -> int:
        return self._cached

    def acquire(self, nbytes: int) -> HostBuffer:
        """A buffer of at least ``nbytes``, reused when one of its size class is free."""
        size = _size_class(nbytes)
        with self._lock:
            free = self._free.get(size)
            if free:
                array = free.pop()
                self._cached -= size
                return HostBuffer(self, array, nbytes)
        return HostBuffer(self, _aligned(size), nbytes)

    def _give_back(self, array: np.ndarray) -> None:
        size = int(array.nbytes)
        with self._lock:
            if self._cached + size <= self._max_cached:
                self._free.setdefault(size, []).append(array)
                self._cached += size
