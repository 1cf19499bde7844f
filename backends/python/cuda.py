"""The GPU side of a python model instance: its device, its stream, the copies across.

Kept apart so that the CPU path, the one CI runs, holds no CUDA code. Each KIND_GPU instance
has its own non-blocking stream on its device. Everything the instance does with user code
(import, ``initialize``, ``execute``, ``finalize``) runs with that device and stream current and
ends by waiting for the stream, whether it succeeded or not: work a user queued on it is
finished before its results (or the weights ``initialize`` uploaded) are used, and the stream
never waits for other instances' work on the legacy default stream.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from server.cuda.copies import (
    c_contiguous,
    fetch,
    fill,
    joined_on_host,
    joined_shape,
    usable_in_place,
)
from server.cuda.devices import DEVICE_KINDS, require_cupy
from server.errors import ModelLoadError
from server.memory.host_pool import HostBufferPool
from server.memory.output_memory import OutputMemory


class CudaPlacement:
    """One instance's CUDA device and stream, and the host/device copies of its tensors."""

    def __init__(self, model: str, device_id: int, host_pool: HostBufferPool) -> None:
        """Raises ``ModelLoadError`` without CuPy and CUDA, or when the device is unusable.
        Outputs are copied back into buffers of ``host_pool``."""
        self._cupy = require_cupy(f"model '{model}' (python backend, instance group KIND_GPU)")
        self._host_pool = host_pool
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
        """The device and stream current on this thread; waits for the stream on the way out,
        after an error too: what the request lent (its pinned buffers, a CUDA shared memory
        region) and the output buffers copies were queued into are let go of once this
        returns, so no queued work may still use them."""
        with self._device, self._stream:
            try:
                yield
            except BaseException:
                with contextlib.suppress(Exception):  # a sticky CUDA error: the first one counts
                    self._stream.synchronize()
                raise
            self._stream.synchronize()

    def to_device(self, parts: Mapping[str, Sequence[Any]]) -> dict[str, Any]:
        """Each input joined from its batch parts: numeric ones into one device array (copies
        queued on the current stream, device parts kept where they are when alone); the rest
        joined on the host."""
        inputs: dict[str, Any] = {}
        for name, pieces in parts.items():
            first = pieces[0]
            if np.dtype(first.dtype).kind not in DEVICE_KINDS:
                inputs[name] = joined_on_host(pieces)
            elif len(pieces) == 1 and usable_in_place(first, self._device.id):
                inputs[name] = first  # already on this GPU (CUDA shared memory)
            else:
                joined = self._cupy.empty(joined_shape(pieces), dtype=first.dtype)
                fill(self._cupy, joined, pieces, self._stream)
                inputs[name] = joined
        return inputs

    def to_host(
        self, outputs: Mapping[str, object], memory: OutputMemory | None = None
    ) -> dict[str, object]:
        """CuPy outputs queued for copying to the host on the stream (large ones into arrays
        of ``memory`` where it has room): valid once ``active`` has waited for it. Anything
        else is passed through."""
        results: dict[str, object] = {}
        try:
            for name, value in outputs.items():
                if isinstance(value, self._cupy.ndarray):
                    value = fetch(
                        c_contiguous(value), value.dtype, self._stream, self._host_pool, memory
                    )
                results[name] = value
        except BaseException:
            # ``results`` still holds the buffers queued copies write into: wait for those
            # copies before the buffers can go back to the pool.
            with contextlib.suppress(Exception):
                self._stream.synchronize()
            raise
        return results
