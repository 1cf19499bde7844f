"""The GPU side of a python model instance: its device, its stream, the copies across.

Kept apart so that the CPU path, the one CI runs, holds no CUDA code. Each KIND_GPU instance
has its own non-blocking stream on its device. Everything the instance does with user code
(import, ``initialize``, ``execute``, ``finalize``) runs with that device and stream current and
ends by waiting for the stream: work a user queued on it is finished before its results (or
the weights ``initialize`` uploaded) are used, and the stream never waits for other instances'
work on the legacy default stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from server.cuda.devices import require_cupy
from server.errors import ModelLoadError

# dtype kinds CuPy holds: bool, signed and unsigned ints, floats. BYTES (object) and BF16
# (ml_dtypes, kind "V"; CuPy has no bfloat16) stay numpy arrays.
_DEVICE_KINDS = frozenset("biuf")


class CudaPlacement:
    """One instance's CUDA device and stream, and the host/device copies of its tensors."""

    def __init__(self, model: str, device_id: int) -> None:
        """Raises ``ModelLoadError`` without CuPy and CUDA, or when the device is unusable."""
        self._cupy = require_cupy(f"model '{model}' (python backend, instance group KIND_GPU)")
        try:
            self._device = self._cupy.cuda.Device(device_id)
            with self._device:
                self._stream = self._cupy.cuda.Stream(non_blocking=True)
        except Exception as exc:  # CUDARuntimeError: no such device, no memory
            raise ModelLoadError(
                f"unable to load model '{model}': CUDA device {device_id} is not usable: {exc}"
            ) from exc

    @contextlib.contextmanager
    def active(self) -> Iterator[None]:
        """The device and stream current on this thread; waits for the stream on a clean exit
        (after an error the stream's work is left to finish, ordered before the next call)."""
        with self._device, self._stream:
            yield
            self._stream.synchronize()

    def to_device(self, inputs: Mapping[str, np.ndarray]) -> dict[str, Any]:
        """Numeric inputs copied to the device (on the current stream); the rest as they are."""
        return {
            name: self._cupy.asarray(array) if array.dtype.kind in _DEVICE_KINDS else array
            for name, array in inputs.items()
        }

    def to_host(self, outputs: Mapping[str, object]) -> dict[str, object]:
        """CuPy outputs queued for copying to numpy on the stream: valid once ``active`` has
        waited for it. Anything else is passed through."""
        return {
            name: (
                self._cupy.asnumpy(value, stream=self._stream)
                if isinstance(value, self._cupy.ndarray)
                else value
            )
            for name, value in outputs.items()
        }
