"""Page-locking a host region that was not allocated by CUDA (the shared arenas).

``cudaHostRegister`` pins an existing mapping, so copies between it and a GPU are DMA, as with
``cudaHostAlloc`` memory. The executor calls ``register_with_cuda`` once for each arena (a
front end's request arena, and the result arena it makes for that front end), after CUDA is
initialised, and ``unregister_from_cuda`` before unmapping it. Pinning can fail
(RLIMIT_MEMLOCK, a driver that refuses the mapping): that is one warning, and copies then go
from pageable memory, slower but correct.
"""

from __future__ import annotations

import logging
import resource
import threading
import time
from types import ModuleType
from typing import Protocol

from server.cuda import devices

log = logging.getLogger(__name__)

#: cudaHostRegisterPortable: pinned for every CUDA context, not only the current device's (the
#: executor may copy to several GPUs). cudaHostRegisterDefault is 0.
HOST_REGISTER_PORTABLE = 1

_lock = threading.Lock()
_registered: dict[int, int] = {}  # address -> size, of the regions this process registered


class HostRegion(Protocol):
    """A mapped host region (``server.memory.arena.Arena``)."""

    @property
    def address(self) -> int: ...

    @property
    def size(self) -> int: ...


def _memlock_limit() -> str:
    try:
        soft, _ = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    except (OSError, ValueError):
        return "unknown"
    return "unlimited" if soft == resource.RLIM_INFINITY else f"{soft} bytes"


def register_with_cuda(
    region: HostRegion, flags: int = HOST_REGISTER_PORTABLE, cupy: ModuleType | None = None
) -> bool:
    """Pin ``region`` for CUDA copies; True when it is pinned (now or already), False without
    CUDA or when the driver refused (logged once per call, with the reason). ``cupy`` defaults
    to ``devices.cupy_module()``."""
    cupy = cupy if cupy is not None else devices.cupy_module()
    if cupy is None:
        return False
    address, size = region.address, region.size
    failure: Exception | None = None
    with _lock:  # nothing is logged while it is held
        if address in _registered:
            return True
        started = time.perf_counter()
        try:
            cupy.cuda.runtime.hostRegister(address, size, flags)
        except Exception as exc:  # noqa: BLE001 - CUDARuntimeError: copies stay pageable
            failure = exc
        else:
            _registered[address] = size
        elapsed = time.perf_counter() - started
    if failure is not None:
        log.warning(
            "could not pin the %d-byte shared arena for CUDA (%s; RLIMIT_MEMLOCK is %s, "
            "containers may need --ulimit memlock=-1): copies between it and a GPU go "
            "through pageable memory",
            size,
            failure,
            _memlock_limit(),
        )
        return False
    log.info("pinned the %d-byte shared arena for CUDA in %.1f ms", size, elapsed * 1e3)
    return True


def unregister_from_cuda(region: HostRegion, cupy: ModuleType | None = None) -> None:
    """Undo ``register_with_cuda`` (nothing when it did not pin ``region``); call it before
    the region is unmapped. A failure is logged, not raised (this runs on the way out)."""
    with _lock:
        if _registered.pop(region.address, None) is None:
            return
    cupy = cupy if cupy is not None else devices.cupy_module()
    if cupy is None:
        return
    try:
        cupy.cuda.runtime.hostUnregister(region.address)
    except Exception as exc:  # noqa: BLE001 - report and go on shutting down
        log.warning("could not unpin the shared arena: %s", exc)


def is_registered(region: HostRegion) -> bool:
    """Whether this process pinned ``region`` with ``register_with_cuda`` (and has not
    unpinned it)."""
    with _lock:
        return region.address in _registered
