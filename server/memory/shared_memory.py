"""Client shared memory regions: Triton's system and CUDA shared memory extensions.

A client on the same node creates a POSIX shared memory object (system) or a CUDA IPC handle
(CUDA), registers it under a name, and then names the region, an offset and a byte size in
tensor parameters instead of sending the bytes.

System regions are read and written through their descriptor, never mapped, so nothing their
owner does to its object can fault (``server.memory.regions``).

Safety: every offset and size is checked at registration and at each use (Python integers do
not overflow, but negative or oversized values are refused before any slicing); a key is a
plain name under ``/dev/shm`` (no path separators), so it cannot reach other files; errors
never echo keys. A region used by a request in flight is leased: unregistering it hides it
at once, but closes it only when the last request using it has finished. Registration is off
unless ``--allow-client-shm=true`` (Triton's current default), with Triton's error text.
Keys are opened without following symbolic links and must name regular files; the number of
regions is bounded (each keeps a descriptor).
"""

from __future__ import annotations

import ctypes
import os
import stat
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from server.cuda.devices import cupy_module
from server.errors import (
    AlreadyExists,
    InferenceServerError,
    InvalidArgument,
    NotFound,
    Unavailable,
    Unsupported,
)
from server.memory.host_pool import HostBufferPool
from server.memory.regions import Region

SHM_ROOT = "/dev/shm"
#: Each system region holds a file descriptor: the registry stops here, well below the usual
#: 1024-descriptor limit the server's sockets and model files also need.
MAX_REGIONS = 256
#: Keys Triton's python backend uses for its own regions; refused as Triton does.
RESERVED_KEY_PREFIX = "triton_python_backend_shm_region_"
#: sizeof(cudaIpcMemHandle_t)
CUDA_IPC_HANDLE_BYTES = 64
DISABLED = (
    "Client shared memory is disabled; start the server with --allow-client-shm=true to use it"
)


class SharedMemoryRegistry:
    """The registered regions of both kinds; thread-safe (loads and inference may overlap)."""

    def __init__(self, enabled: bool, pool: HostBufferPool | None = None) -> None:
        """``pool`` (the server's host pool) holds the copies of system region inputs; without
        one they are page-aligned numpy memory."""
        self.enabled = enabled
        self._pool = pool
        self._regions: dict[tuple[str, str], Region] = {}
        self._lock = threading.Lock()

    @property
    def cuda_available(self) -> bool:
        return cupy_module() is not None

    # --- registration ------------------------------------------------------------------------

    def register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._check_enabled()
        _check_name(name)
        for value, what in ((offset, "offset"), (byte_size, "byte_size")):
            if type(value) is not int or value < 0:
                raise InvalidArgument(f"Invalid {what} for shared memory region: '{name}'")
        if key.removeprefix("/").startswith(RESERVED_KEY_PREFIX):
            raise InvalidArgument(
                f"cannot register shared memory region '{name}' with key '{key}' as the key "
                f"contains the reserved prefix '{RESERVED_KEY_PREFIX}'"
            )
        path = _key_path(key, name)
        self._check_free(name)
        try:
            # O_NOFOLLOW, as shm_open: a symbolic link under /dev/shm must not lead elsewhere.
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            raise InvalidArgument(
                f"failed to register shared memory region '{name}': unable to open the shared "
                "memory object of that key (invalid args)"
            ) from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise InvalidArgument(
                    f"failed to register shared memory region '{name}': the key does not name "
                    "a shared memory object (invalid args)"
                )
            size = info.st_size
            if offset >= size and not (offset == 0 and size == 0):
                raise InvalidArgument(f"Invalid offset for shared memory region: '{name}'")
            if offset + byte_size > size:
                raise InvalidArgument(
                    f"Invalid offset + byte size for shared memory region: '{name}'"
                )
        except BaseException:
            os.close(fd)
            raise
        self._add(Region(name, "system", byte_size, key=key, offset=offset, fd=fd))

    def register_cuda(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        self._check_enabled()
        _check_name(name)
        cupy = cupy_module()
        if cupy is None:
            raise Unsupported(
                "CUDA shared memory is not available: this server has no CUDA device"
            )
        if (
            type(device_id) is not int
            or device_id < 0
            or type(byte_size) is not int
            or byte_size < 0
            or len(raw_handle) != CUDA_IPC_HANDLE_BYTES
        ):
            raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
        self._check_free(name)
        try:
            with cupy.cuda.Device(device_id):
                pointer = cupy.cuda.runtime.ipcOpenMemHandle(raw_handle)
                try:
                    _check_cuda_size(pointer, byte_size, name)
                    memory = cupy.cuda.UnownedMemory(pointer, byte_size, None, device_id)
                    array = cupy.ndarray(
                        (byte_size,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0)
                    )
                except BaseException:
                    # A handle opens once per process: a mapping left open would keep this
                    # allocation from ever being registered again.
                    cupy.cuda.runtime.ipcCloseMemHandle(pointer)
                    raise
        except InferenceServerError:
            raise
        except Exception as exc:  # noqa: BLE001 - a bad handle, another device, no peer access
            raise InvalidArgument(
                f"failed to register shared memory region '{name}': invalid args ({exc})"
            ) from None
        self._add(Region(name, "cuda", byte_size, device_id=device_id, memory=array))

    def unregister(self, kind: str, name: str) -> None:
        """Unregister one region (``name``), or every region of ``kind`` (empty name). A region
        in use is closed when its last request finishes."""
        self._check_enabled()
        with self._lock:
            if name:
                region = self._regions.pop((kind, name), None)
                regions = [region] if region is not None else []
            else:
                regions = [r for (k, _), r in self._regions.items() if k == kind]
                for region in regions:
                    del self._regions[(kind, region.name)]
        for region in regions:
            with region.lock:
                region.retired = True
                if region.users == 0:
                    region.close()

    def status(self, kind: str, name: str) -> list[dict[str, Any]]:
        """Triton's status entries of ``kind``, one region or all of them."""
        self._check_enabled()
        with self._lock:
            if name:
                region = self._regions.get((kind, name))
                if region is None:
                    raise NotFound(_unknown(kind, name))
                regions = [region]
            else:
                regions = [r for (k, _), r in sorted(self._regions.items()) if k == kind]
        if kind == "system":
            return [
                {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
                for r in regions
            ]
        return [
            {"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions
        ]

    # --- use by requests ---------------------------------------------------------------------

    @contextmanager
    def lease(self, names: set[str]) -> Iterator[RegionLease]:
        """Hold the named regions for one request: they stay open until it is done."""
        held: list[Region] = []
        try:
            for name in sorted(names):
                region = self._find(name)
                with region.lock:
                    if region.retired:
                        raise NotFound(_unknown(region.kind, name))
                    region.users += 1
                held.append(region)
            yield RegionLease({region.name: region for region in held}, self._pool)
        finally:
            for region in held:
                with region.lock:
                    region.users -= 1
                    if region.retired and region.users == 0:
                        region.close()

    def _find(self, name: str) -> Region:
        self._check_enabled()
        with self._lock:
            region = self._regions.get(("system", name)) or self._regions.get(("cuda", name))
        if region is None:
            raise NotFound(f"Unable to find shared memory region: '{name}'")
        return region

    # --- helpers -------------------------------------------------------------------------------

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise InvalidArgument(DISABLED)

    def _check_free(self, name: str) -> None:
        """One namespace for both kinds, as Triton; and a bounded number of regions."""
        with self._lock:
            if any(key[1] == name for key in self._regions):
                raise AlreadyExists(f"shared memory region '{name}' already in manager")
            if len(self._regions) >= MAX_REGIONS:
                raise Unavailable(
                    f"failed to register shared memory region '{name}': {MAX_REGIONS} regions "
                    "are registered already; unregister some first"
                )

    def _add(self, region: Region) -> None:
        with self._lock:
            if any(key[1] == region.name for key in self._regions):
                region.close()
                raise AlreadyExists(f"shared memory region '{region.name}' already in manager")
            self._regions[(region.kind, region.name)] = region

    def close(self) -> None:
        """Close every region (server shutdown)."""
        if self.enabled:
            self.unregister("system", "")
            self.unregister("cuda", "")


@dataclass
class RegionLease:
    """The regions one request holds, with bounds-checked access."""

    regions: dict[str, Region]
    pool: HostBufferPool | None = None

    def read(self, name: str, offset: int, byte_size: int, tensor: str) -> memoryview:
        """A copy of the bytes in host memory, the request's own: no later change to the region
        (an output written into it, the client's next request) reaches it."""
        region = self._checked(name, offset, byte_size, tensor)
        return region.host_copy(offset, byte_size, tensor, self.pool)

    def read_on_device(self, name: str, offset: int, byte_size: int, tensor: str) -> Any | None:
        """The bytes of a CUDA region in place, as a CuPy uint8 array on its device (no copy);
        None for a system region, or an empty range (which maps nothing)."""
        region = self._checked(name, offset, byte_size, tensor)
        if region.kind != "cuda" or region.memory is None or byte_size == 0:
            return None
        return region.device_view(offset, byte_size)

    def write(self, name: str, offset: int, byte_size: int, tensor: str, data: memoryview) -> None:
        region = self._checked(name, offset, byte_size, tensor)
        if data.nbytes > byte_size:
            raise InvalidArgument(
                f"shared memory size specified with the request for output '{tensor}' "
                f"({byte_size} bytes) should be at least {data.nbytes} bytes to hold the results"
            )
        region.write(offset, data, tensor)

    def _checked(self, name: str, offset: int, byte_size: int, tensor: str) -> Region:
        region = self.regions[name]
        if offset < 0 or byte_size < 0:
            raise InvalidArgument(f"Invalid offset for shared memory region: '{name}'")
        if offset >= region.byte_size and (offset or byte_size):  # Triton: offset < size
            raise InvalidArgument(f"Invalid offset for shared memory region: '{name}'")
        if offset + byte_size > region.byte_size:
            raise InvalidArgument(
                f"Invalid offset + byte size for shared memory region: '{name}' (tensor "
                f"'{tensor}')"
            )
        return region


def _check_cuda_size(pointer: int, byte_size: int, name: str) -> None:
    """Refuse a CUDA region claiming more bytes than the allocation behind the handle has:
    reads or writes past it would corrupt another process's memory or the CUDA context."""
    allocation = _allocation_range(pointer)
    if allocation is None or pointer + byte_size > allocation[0] + allocation[1]:
        reason = (
            "the size of the CUDA allocation behind the handle cannot be checked"
            if allocation is None
            else f"byte_size {byte_size} exceeds the CUDA allocation of the handle"
        )
        raise InvalidArgument(
            f"failed to register shared memory region '{name}': {reason} (invalid args)"
        )


def _allocation_range(pointer: int) -> tuple[int, int] | None:
    """``(base, size)`` of the device allocation holding ``pointer`` (the driver's
    ``cuMemGetAddressRange``, which CuPy does not wrap), or None when it cannot be asked."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    query = getattr(driver, "cuMemGetAddressRange_v2", None) or driver.cuMemGetAddressRange
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    status = query(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(pointer))
    return (int(base.value), int(size.value)) if status == 0 else None


def _check_name(name: str) -> None:
    if not name:
        raise InvalidArgument("a shared memory region needs a name")


def _key_path(key: str, name: str) -> str:
    """The file of a POSIX shared memory key: one plain name under ``/dev/shm``."""
    plain = key.removeprefix("/")
    if not plain or "/" in plain or plain in (".", "..") or "\0" in plain:
        raise InvalidArgument(f"failed to register shared memory region '{name}': invalid args")
    return os.path.join(SHM_ROOT, plain)


def _unknown(kind: str, name: str) -> str:
    label = "system" if kind == "system" else "CUDA"
    return f"Unable to find {label} shared memory region: '{name}'"
