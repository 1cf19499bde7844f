"""One client shared memory region and how its bytes move in and out.

A system region keeps the descriptor of ``/dev/shm/<key>`` opened at registration, and is
never mapped: its owner may truncate the object at any time, and a mapping (Triton's way)
faults on the first access past the new end, a SIGBUS that kills the whole server. Instead
each use ``fstat``s the descriptor and refuses a region its object no longer holds; inputs are
copied out with ``preadv`` into host memory (a buffer of the server's pool: pinned with a GPU)
and outputs copied in with ``pwritev``. Where a mapping would fault the kernel answers a short
count or an error, so an object truncated even between the check and the copy is a refusal
(or, for a write, grows back). That costs one copy of each input, which a mapping saves;
outputs cost one copy either way. The region is the object as opened: one unlinked or
replaced under the same key is still the one read and written until the client registers
again.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from server.cuda.devices import cupy_module
from server.errors import InvalidArgument
from server.memory.host_pool import HostBufferPool, page_aligned

log = logging.getLogger(__name__)

#: ``os.preadv`` / ``os.pwritev``: (descriptor, buffers, position) -> bytes moved.
_Transfer = Callable[[int, list[memoryview], int], int]


@dataclass(eq=False)
class Region:
    """One registered region, how its bytes are moved, and the requests using it."""

    name: str
    kind: str  # "system" | "cuda"
    byte_size: int
    key: str = ""
    offset: int = 0
    device_id: int = 0
    fd: int = -1  # system: the object's descriptor (never mapped: see the module docstring)
    memory: Any = None  # CUDA: a CuPy uint8 array over the IPC mapping
    users: int = 0
    retired: bool = False  # unregistered: close when the last user is done
    lock: threading.Lock = field(default_factory=threading.Lock)

    def host_copy(
        self, offset: int, byte_size: int, tensor: str, pool: HostBufferPool | None
    ) -> memoryview:
        """``byte_size`` bytes at ``offset`` of the region, copied into host memory."""
        if self.kind == "system":
            self._check_object(tensor)
            if byte_size == 0:
                return memoryview(b"")
            # Pooled memory is pinned with a GPU (the executor's copy to the device is DMA) and
            # goes back to the pool when the tensor's last view is gone.
            target = pool.array(byte_size) if pool is not None else page_aligned(byte_size)
            if not self._move(os.preadv, target.data, offset, tensor):
                raise self._smaller(tensor, "it was truncated while being read")
            return target.data
        if self.memory is None or byte_size == 0:  # a CUDA region of 0 bytes maps nothing
            return memoryview(b"")
        # CUDA, for an instance that takes host arrays (or BYTES, parsed on the host): the
        # bytes are copied out of the device once.
        return memoryview(self.device_view(offset, byte_size).get())

    def device_view(self, offset: int, byte_size: int) -> Any:
        """``byte_size`` bytes at ``offset`` of a CUDA region, in place: a CuPy uint8 array."""
        return self.memory[offset : offset + byte_size]

    def write(self, offset: int, data: memoryview, tensor: str) -> None:
        if self.kind == "system":
            self._check_object(tensor)
            # A write past the end of an object truncated since the check grows it back.
            if not self._move(os.pwritev, data.cast("B"), offset, tensor):
                raise InvalidArgument(
                    f"failed to write output '{tensor}' to shared memory region "
                    f"'{self.name}': the write stopped short"
                )
        elif data.nbytes:
            source = np.frombuffer(data, dtype=np.uint8)
            cupy = cupy_module()
            assert cupy is not None  # a CUDA region exists only where CuPy does
            with cupy.cuda.Device(self.device_id):
                stream = cupy.cuda.get_current_stream()
                self.memory[offset : offset + data.nbytes].set(source, stream=stream)
                # Landed before the answer goes out (the client reads the region then) and
                # before ``data``, maybe a pooled buffer, is reused.
                stream.synchronize()

    def _check_object(self, tensor: str) -> None:
        """Refuse a system region whose object no longer reaches the region's end (truncated
        by its owner since registration)."""
        size = os.fstat(self.fd).st_size
        if size < self.offset + self.byte_size:
            raise self._smaller(
                tensor,
                f"its shared memory object now has {size} bytes, the region ends at byte "
                f"{self.offset + self.byte_size}",
            )

    def _smaller(self, tensor: str, why: str) -> InvalidArgument:
        return InvalidArgument(
            f"shared memory region '{self.name}' for tensor '{tensor}' is smaller than "
            f"registered: {why}"
        )

    def _move(self, call: _Transfer, view: memoryview, offset: int, tensor: str) -> bool:
        """``call`` (``os.preadv`` or ``os.pwritev``) until all of ``view`` has moved, at
        ``offset`` of the region; False if it stops short (a read at the object's end). One
        call moves at most about 2 GiB, hence the loop."""
        done = 0
        while done < view.nbytes:
            try:
                count = call(self.fd, [view[done:]], self.offset + offset + done)
            except OSError as exc:  # /dev/shm full under a sparse object, an I/O error
                raise InvalidArgument(
                    f"shared memory region '{self.name}' for tensor '{tensor}' cannot be "
                    f"accessed: {exc.strerror}"
                ) from None
            if count == 0:
                return False
            done += count
        return True

    def close(self) -> None:
        """Close the descriptor (system) or the IPC mapping (CUDA): no request uses the region
        any more (leases)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        elif self.kind == "cuda" and self.memory is not None:
            cupy = cupy_module()
            # No request uses it any more (leases), and every GPU instance waits for its
            # stream before a request ends, failed ones included: no queued work reads it.
            if cupy is not None:
                try:
                    with cupy.cuda.Device(self.device_id):
                        cupy.cuda.runtime.ipcCloseMemHandle(self.memory.data.ptr)
                except Exception:  # the region goes anyway
                    log.exception("closing CUDA shared memory region '%s' failed", self.name)
        self.memory = None
