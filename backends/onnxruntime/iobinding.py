"""ONNX Runtime through IO binding: inputs bound where the session computes, outputs fetched once.

A ``BoundDevice`` decides where bound tensors live. ``CudaDevice`` is the GPU data path
(DESIGN.md "The request path"): each request's part of each input is copied host→device once,
asynchronously on the instance's own CUDA stream, into its rows of a device buffer the instance
keeps from batch to batch (taken from the GPU's ``DevicePools`` pool, grown when a batch needs
more), and an input already on that GPU (CUDA shared memory) is bound where it is; the stream is
synchronised
before the run (ORT computes on its own stream and knows nothing of ours, the classic
IO-binding race of gpu-facts §3.3) and the session is also given that stream as its compute
stream; ORT allocates the outputs on the device (their shapes are only known after the run) and
each is copied device→host once into a buffer of the server's host pool (pinned memory), with
a stream sync before the answers leave. ``HostDevice`` binds the caller's host arrays by address, the same code path on a
machine without a GPU, so CI runs it.

ONNX Runtime cannot bind string tensors (nor make OrtValues of them) from Python, so a run that
has a BYTES input or asks for a BYTES output goes through the instance's ``fallback`` (plain
``session.run``, which still computes on the session's provider). BF16 is bound by its ONNX
element type.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import onnxruntime as ort

from backends.base import ModelInstance, PartsInstance
from backends.onnxruntime.ort_types import BF16, ONNX_BFLOAT16, ORT_DTYPES, ort_value_to_numpy
from backends.onnxruntime.strings import strings_to_bytes
from server.cuda.copies import (
    c_contiguous,
    fetch,
    fill,
    joined_on_host,
    joined_shape,
    storage_dtype,
    usable_in_place,
)
from server.memory.device_pool import DevicePools
from server.memory.host_pool import HostBufferPool, size_class
from server.memory.output_memory import OutputMemory

log = logging.getLogger(__name__)


def element_type(dtype: np.dtype) -> Any:
    """What ``bind_input``/``bind_output`` take as the element type of ``dtype``."""
    return ONNX_BFLOAT16 if dtype == BF16 else dtype.type


def host_value(value: ort.OrtValue) -> np.ndarray:
    """A host OrtValue as numpy, strings mapped back to bytes."""
    array = ort_value_to_numpy(value)
    return strings_to_bytes(array) if array.dtype == object else array


class BoundDevice(Protocol):
    """Where one instance's bound tensors live."""

    #: Whether it joins batches and takes device arrays (``ModelInstance.joins_on_device``).
    joins_on_device: bool

    def bind_input(self, binding: ort.IOBinding, name: str, parts: Sequence[Any]) -> None:
        """Bind as input ``name`` the tensor ``parts`` make joined along their first axis
        (never BYTES)."""

    def bind_output(self, binding: ort.IOBinding, name: str) -> None:
        """Bind output ``name`` for ORT to allocate."""

    def before_run(self) -> None:
        """Make every bound input's bytes visible to the session."""

    def fetch(
        self, values: Sequence[ort.OrtValue], memory: OutputMemory | None = None
    ) -> list[np.ndarray]:
        """The run's outputs as host arrays, complete when this returns; large ones may be
        copied into arrays of ``memory``."""

    def abandon(self) -> None:
        """After a failed bind, run or fetch: wait for whatever was queued and let go of the
        inputs, whose buffers the request releases next."""


class HostDevice:
    """Bindings by host address: the CPU provider, and the IO-binding path without a GPU."""

    joins_on_device = False

    def __init__(self) -> None:
        self._held: list[np.ndarray] = []

    def bind_input(self, binding: ort.IOBinding, name: str, parts: Sequence[Any]) -> None:
        array = c_contiguous(joined_on_host(parts))
        self._held.append(array)  # the bound address must stay valid until the run ends
        binding.bind_input(
            name, "cpu", 0, element_type(array.dtype), list(array.shape), array.ctypes.data
        )

    def bind_output(self, binding: ort.IOBinding, name: str) -> None:
        binding.bind_output(name, "cpu")

    def before_run(self) -> None:
        """Host memory needs no synchronisation."""

    def fetch(
        self, values: Sequence[ort.OrtValue], memory: OutputMemory | None = None
    ) -> list[np.ndarray]:
        """ORT wrote the outputs into host memory of its own: copying them into ``memory``
        would move the copy the caller makes, not save it."""
        self._held.clear()
        return [host_value(value) for value in values]

    def abandon(self) -> None:
        self._held.clear()


class CudaDevice:
    """Bindings on one GPU, with the instance's stream and reused device input buffers."""

    joins_on_device = True

    def __init__(
        self,
        cupy: Any,
        device_id: int,
        stream: Any,
        pools: DevicePools,
        host_pool: HostBufferPool,
    ) -> None:
        """``pools`` hold the device input buffers, ``host_pool`` the outputs' host copies."""
        self._cupy = cupy
        self.device_id = device_id
        self.stream = stream
        self._pools = pools
        self._host_pool = host_pool
        self._buffers: dict[str, Any] = {}  # input name -> 1-D uint8 device buffer
        self._held: list[Any] = []  # device inputs bound in place, alive until the run ends

    def _device_view(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Any:
        """A device array of ``shape`` on this input's reused buffer, of ``dtype`` or, for one
        CuPy lacks (BF16), of the unsigned integer of its size: ORT is told the real type."""
        nbytes = math.prod(shape) * dtype.itemsize
        buffer = self._buffers.get(name)
        if buffer is None or buffer.nbytes < nbytes:
            capacity = size_class(nbytes, minimum=2)  # grow by powers of two
            try:
                buffer = self._pools.empty(self.device_id, capacity)
            except self._cupy.cuda.memory.OutOfMemoryError:
                # The capped pool is full (--cuda-memory-pool-byte-size): this input's buffer
                # comes from CuPy's default pool instead, exactly sized, rather than failing.
                buffer = self._cupy.empty(nbytes, dtype=self._cupy.uint8)
            self._buffers[name] = buffer
        return buffer[:nbytes].view(storage_dtype(dtype)).reshape(shape)

    def bind_input(self, binding: ort.IOBinding, name: str, parts: Sequence[Any]) -> None:
        first = parts[0]
        with self._cupy.cuda.Device(self.device_id):
            if len(parts) == 1 and usable_in_place(first, self.device_id):
                view = first  # already on this GPU (CUDA shared memory): no copy at all
                self._held.append(view)
            else:
                view = self._device_view(name, np.dtype(first.dtype), joined_shape(parts))
                fill(self._cupy, view, parts, self.stream)
        binding.bind_input(
            name,
            "cuda",
            self.device_id,
            element_type(np.dtype(first.dtype)),
            list(view.shape),
            view.data.ptr,
        )

    def bind_output(self, binding: ort.IOBinding, name: str) -> None:
        binding.bind_output(name, "cuda", self.device_id)

    def before_run(self) -> None:
        # The copies were queued on our stream; the session must not read before they land.
        self.stream.synchronize()

    def fetch(
        self, values: Sequence[ort.OrtValue], memory: OutputMemory | None = None
    ) -> list[np.ndarray]:
        cupy = self._cupy
        results: list[np.ndarray] = []
        with cupy.cuda.Device(self.device_id):
            try:
                self._fetch_into(results, values, memory)
            except BaseException:
                # ``results`` still holds the buffers queued copies write into: wait for
                # those copies before the buffers can go back to the pool.
                self.abandon()
                raise
            self.stream.synchronize()  # every D2H copy has landed before anyone reads
        self._held.clear()
        return results

    def _fetch_into(
        self,
        results: list[np.ndarray],
        values: Sequence[ort.OrtValue],
        memory: OutputMemory | None,
    ) -> None:
        """Queue each output's copy to the host (into ``memory`` where it has room), appending
        its host array to ``results``."""
        cupy = self._cupy
        for value in values:
            if value.device_name().lower() != "cuda":  # strings, CPU-placed outputs
                results.append(host_value(value))
                continue
            dtype = ORT_DTYPES[value.data_type()]
            shape = tuple(value.shape())
            nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if nbytes == 0:  # ORT allocates nothing for an empty tensor (null pointer)
                results.append(np.empty(shape, dtype=dtype))
                continue
            held = cupy.cuda.UnownedMemory(value.data_ptr(), nbytes, value, self.device_id)
            device = cupy.ndarray(shape, storage_dtype(dtype), cupy.cuda.MemoryPointer(held, 0))
            results.append(fetch(device, dtype, self.stream, self._host_pool, memory))

    def abandon(self) -> None:
        try:
            self.stream.synchronize()
        except Exception:  # a sticky CUDA error: the run's own error is the one reported
            log.exception("waiting for GPU %d's stream after a failed run", self.device_id)
        self._held.clear()


class IoBindingInstance(PartsInstance):
    """One ONNX Runtime session run with ``run_with_iobinding`` on a ``BoundDevice``."""

    def __init__(
        self,
        session: ort.InferenceSession,
        device: BoundDevice,
        fallback: ModelInstance,
        string_outputs: frozenset[str] = frozenset(),
    ) -> None:
        """``fallback`` runs what cannot be bound: BYTES inputs, or ``string_outputs``."""
        self._session = session
        self._device = device
        self._fallback = fallback
        self._string_outputs = string_outputs
        self._binding = session.io_binding()
        self.joins_on_device = device.joins_on_device
        # A GPU run waits for its stream: never on the event loop, whichever scheduler.
        self.may_run_inline = not device.joins_on_device

    def close(self) -> None:
        """Let go of the binding and the session (the fallback shares it) now: a GPU session
        computes on the device's stream, which must outlive it, and the device goes only
        with this object."""
        self._fallback.close()
        del self._binding, self._session, self._fallback

    def execute_parts(
        self,
        parts: Mapping[str, Sequence[Any]],
        output_names: Sequence[str],
        memory: OutputMemory | None = None,
    ) -> dict[str, np.ndarray]:
        if self._string_outputs.intersection(output_names) or any(
            pieces[0].dtype == object for pieces in parts.values()
        ):
            return self._fallback.execute(
                {name: joined_on_host(pieces) for name, pieces in parts.items()}, output_names
            )
        binding = self._binding
        binding.clear_binding_inputs()
        binding.clear_binding_outputs()
        names = list(output_names)
        try:
            for name, pieces in parts.items():
                self._device.bind_input(binding, name, pieces)
            for name in names:
                self._device.bind_output(binding, name)
            self._device.before_run()
            self._session.run_with_iobinding(binding)
            outputs = self._device.fetch(binding.get_outputs(), memory)
        except BaseException:
            self._device.abandon()
            raise
        return dict(zip(names, outputs, strict=True))

