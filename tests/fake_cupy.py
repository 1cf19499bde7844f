"""A stand-in for the slice of CuPy the server uses, backed by numpy, that logs what is done.

CI has no CUDA. The GPU code paths (device batch joins, python models on KIND_GPU, CUDA
shared memory inputs) are checked against this stand-in for the order and placement of their
copies; gpu_tests/ runs the real thing. "Device" memory is numpy memory that numpy refuses to
take implicitly, as CuPy does, so an array that was meant to be copied to the host and was not
fails loudly. ``events`` records every copy and stream/device switch:

- ``"H2D <dtype> <stream>"`` a host-to-device ``set`` (``stream`` is "stream" or "none"),
- ``"D2D <bytes> <stream>"`` a device-to-device copy,
- ``"to device <dtype>"`` an ``asarray`` upload, ``"to host"`` an ``asnumpy``/``get``,
- ``"device N on|off"``, ``"stream on|off"``, ``"synchronize"``, ``"compute"``,
- ``"hostRegister <address> <bytes> <flags>"``, ``"hostUnregister <address>"`` (pinning host
  memory; set ``host_register_error`` to an exception to make ``hostRegister`` fail with it).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Literal

import numpy as np


class FakeMemoryPointer:
    """``ndarray.data``: the address, and device-to-device copies into it."""

    def __init__(self, array: FakeArray) -> None:
        self._array = array
        self.ptr = int(array.host.ctypes.data)

    def copy_from_device_async(self, source: FakeMemoryPointer, size: int, stream: Any) -> None:
        self._array.events.append(f"D2D {size} {_stream_label(stream)}")
        target = self._array.host.reshape(-1).view(np.uint8)
        target[:size] = source._array.host.reshape(-1).view(np.uint8)[:size]


class FakeArray:
    """A device array: a numpy array (``host``) that numpy cannot read implicitly."""

    def __init__(self, host: np.ndarray, events: list[str], device_id: int = 0) -> None:
        self.host = host
        self.events = events
        self.device = SimpleNamespace(id=device_id)

    # --- what CuPy arrays have -----------------------------------------------------------

    shape = property(lambda self: self.host.shape)
    dtype = property(lambda self: self.host.dtype)
    size = property(lambda self: self.host.size)
    nbytes = property(lambda self: self.host.nbytes)
    ndim = property(lambda self: self.host.ndim)
    flags = property(lambda self: self.host.flags)
    data = property(lambda self: FakeMemoryPointer(self))

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {"shape": self.shape, "typestr": self.dtype.str, "version": 3}

    def _wrap(self, host: np.ndarray) -> FakeArray:
        return FakeArray(host, self.events, self.device.id)

    def __getitem__(self, key: Any) -> FakeArray:
        return self._wrap(self.host[key])

    def __len__(self) -> int:
        return len(self.host)

    def view(self, dtype: Any) -> FakeArray:
        return self._wrap(self.host.view(dtype))

    def reshape(self, *shape: Any) -> FakeArray:
        return self._wrap(self.host.reshape(*shape))

    def copy(self, order: Literal["K", "A", "C", "F"] = "C") -> FakeArray:
        return self._wrap(self.host.copy(order=order))

    def set(self, array: np.ndarray, stream: Any = None) -> None:
        """Host to device, with CuPy's checks: a numpy array of the same shape and dtype."""
        assert isinstance(array, np.ndarray), type(array)
        assert array.shape == self.shape and array.dtype == self.dtype, (array, self.host)
        assert self.host.flags.c_contiguous
        self.events.append(f"H2D {array.dtype} {_stream_label(stream)}")
        self.host[...] = array

    def get(self, stream: Any = None, out: np.ndarray | None = None, blocking: bool = True) -> Any:
        self.events.append("to host")
        if out is None:
            return self.host.copy()
        out[...] = self.host
        return out

    def __mul__(self, other: FakeArray) -> FakeArray:
        self.events.append("compute")
        return self._wrap(self.host * other.host)

    def __array__(self, *args: Any, **kwargs: Any) -> np.ndarray:
        raise TypeError("Implicit conversion to a NumPy array is not allowed")


class FakeStream:
    def __init__(self, events: list[str], non_blocking: bool = False) -> None:
        self._events = events
        self.ptr = 0
        events.append(f"new stream non_blocking={non_blocking}")

    def __enter__(self) -> None:
        self._events.append("stream on")

    def __exit__(self, *exc: object) -> None:
        self._events.append("stream off")

    def synchronize(self) -> None:
        self._events.append("synchronize")


class OutOfMemoryError(Exception):
    """cupy.cuda.memory.OutOfMemoryError."""


class FakeCupy:
    """The module: array makers, ``cuda.Device``/``Stream``, and the ``events`` log."""

    uint8 = np.uint8

    def __init__(self) -> None:
        self.events: list[str] = []
        self.ndarray = FakeArray
        self.host_register_error: Exception | None = None
        events = self.events

        def host_register(address: int, size: int, flags: int) -> None:
            if self.host_register_error is not None:
                raise self.host_register_error
            events.append(f"hostRegister {address} {size} {flags}")

        def host_unregister(address: int) -> None:
            events.append(f"hostUnregister {address}")

        class Device:
            def __init__(self, device_id: int = 0) -> None:
                self.id = device_id

            def __enter__(self) -> None:
                events.append(f"device {self.id} on")

            def __exit__(self, *exc: object) -> None:
                events.append(f"device {self.id} off")

        self.cuda = SimpleNamespace(
            Device=Device,
            Stream=lambda non_blocking=False: FakeStream(events, non_blocking),
            memory=SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
            runtime=SimpleNamespace(hostRegister=host_register, hostUnregister=host_unregister),
        )

    def device_array(self, array: np.ndarray, device_id: int = 0) -> FakeArray:
        """A device array holding a copy of ``array`` (what a CUDA shared memory read gives)."""
        return FakeArray(np.array(array), self.events, device_id)

    def empty(self, shape: Any, dtype: Any = np.float64) -> FakeArray:
        return FakeArray(np.empty(shape, dtype=dtype), self.events)

    def asarray(self, array: Any) -> FakeArray:
        if isinstance(array, FakeArray):
            return array
        self.events.append(f"to device {array.dtype}")
        return FakeArray(np.array(array), self.events)

    def ascontiguousarray(self, array: FakeArray) -> FakeArray:
        return array if array.flags.c_contiguous else array._wrap(array.host.copy())

    def asnumpy(self, value: FakeArray, stream: Any = None) -> np.ndarray:
        assert isinstance(stream, FakeStream)
        self.events.append("to host")
        return value.host.copy()


def _stream_label(stream: Any) -> str:
    return "stream" if isinstance(stream, FakeStream) else "none"
