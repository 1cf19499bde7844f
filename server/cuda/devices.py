"""CUDA when this machine has it: CuPy is imported on first use and never required.

Everything GPU-shaped in the server asks here first. Without CuPy, without a driver or without
a device, ``cupy_module()`` is None and ``device_count()`` 0, and the server runs on the CPU
(ONNX Runtime's CPU provider, page-aligned numpy buffers). ``TENSORGATE_DISABLE_CUDA=1`` makes
a machine with a GPU behave the same way, which the tests use to pin the CPU path.
"""

from __future__ import annotations

import functools
import logging
import os
from types import ModuleType
from typing import Any

import numpy as np

from server.errors import ModelLoadError

log = logging.getLogger(__name__)

#: numpy dtype kinds CuPy holds: bool, signed and unsigned integers, floats. BYTES (object) and
#: BF16 (ml_dtypes, kind "V"; CuPy has no bfloat16) stay in host memory.
DEVICE_KINDS = frozenset("biuf")


def cuda_disabled() -> bool:
    """``TENSORGATE_DISABLE_CUDA`` is set: behave as a machine without GPUs."""
    return os.environ.get("TENSORGATE_DISABLE_CUDA", "") not in ("", "0")


@functools.cache
def cupy_module() -> ModuleType | None:
    """``cupy`` when it imports and sees at least one device, else None (probed once)."""
    if cuda_disabled():
        return None
    try:
        import cupy
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken CUDA install
        log.debug("CuPy unavailable: %s", exc)
        return None
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # noqa: BLE001 - no driver, no device: CUDARuntimeError
        log.info("CuPy is installed but no CUDA device is usable: %s", exc)
        return None
    return cupy if count > 0 else None


def device_count() -> int:
    """CUDA devices this process can use (0 without CuPy or CUDA)."""
    cupy = cupy_module()
    return 0 if cupy is None else int(cupy.cuda.runtime.getDeviceCount())


def require_cupy(what: str) -> ModuleType:
    """CuPy, or a ``ModelLoadError`` saying that ``what`` needs a CUDA device."""
    cupy = cupy_module()
    if cupy is None:
        raise ModelLoadError(
            f"{what} needs a CUDA device and CuPy, which this server does not have"
        )
    return cupy


def on_device(array: object) -> bool:
    """Whether ``array`` lives in GPU memory (a CuPy array, or anything exporting the CUDA
    array interface), as inputs read from CUDA shared memory do."""
    return not isinstance(array, np.ndarray) and hasattr(array, "__cuda_array_interface__")


def host_array(array: Any) -> np.ndarray:
    """``array`` in host memory: numpy arrays as they are, device arrays copied once."""
    if on_device(array):
        copied: np.ndarray = array.get()
        return copied
    return np.asarray(array)
