"""The copies of the GPU path: batches joined on the device, outputs fetched into the pool.

GPU instances (ONNX Runtime through IO binding, python models on KIND_GPU) join their batches
here instead of concatenating them on the host first: a host part is one asynchronous copy
from its (pinned) request buffer, a device part (CUDA shared memory) one device-to-device copy,
both queued on the instance's stream. Their outputs come back with one device-to-host copy
each: for a request run alone, into a block of the executor's result arena that its run was
offered (pinned; the front end writes the answer from there), else into a buffer of the server's
host pool (pinned, within ``--pinned-memory-pool-byte-size``), which returns to the pool once
the last view of it is gone: after the responses that carry it have been written.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from server.cuda.devices import DEVICE_KINDS, host_array, on_device
from server.memory.host_pool import HostBufferPool
from server.memory.output_memory import OutputMemory

#: Outputs smaller than this come back into plain numpy memory, not a pooled (pinned) buffer:
#: the smallest pooled buffer is 64 KiB, held until the batch's last response is written.
SMALL_OUTPUT_BYTES = 1 << 16


def joined_shape(parts: Sequence[Any]) -> tuple[int, ...]:
    """The shape of ``parts`` joined along their first axis (one part: its own shape)."""
    first = parts[0]
    if len(parts) == 1:
        return tuple(first.shape)
    return (sum(part.shape[0] for part in parts), *first.shape[1:])


def usable_in_place(part: Any, device_id: int) -> bool:
    """Whether ``part`` is a device array that GPU ``device_id`` can compute on where it is
    (CUDA shared memory): on that device, C-contiguous and aligned for its dtype."""
    return (
        on_device(part)
        and part.device.id == device_id
        and part.flags.c_contiguous
        and part.data.ptr % max(part.dtype.itemsize, 1) == 0
    )


def joined_on_host(parts: Sequence[Any]) -> np.ndarray:
    """``parts`` joined along their first axis in host memory (for what stays on the host:
    BYTES, BF16, the CPU path); a single host part is passed through as it is."""
    arrays = [host_array(part) for part in parts]
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays)


def fill(cupy: Any, target: Any, parts: Sequence[Any], stream: Any) -> None:
    """Copy ``parts`` into their rows of the C-contiguous device array ``target`` (shaped
    ``joined_shape(parts)``), asynchronously on ``stream``: valid once the stream is waited for
    or work queued after it runs. Device parts may be on another GPU (a peer copy)."""
    if len(parts) == 1:
        targets = [target]
    else:
        ends = np.cumsum([part.shape[0] for part in parts]).tolist()
        targets = [target[start:end] for start, end in zip([0, *ends[:-1]], ends)]
    with stream:  # a contiguous copy of a strided part is made on the stream too
        for part, rows in zip(parts, targets, strict=True):
            source = c_contiguous(part)
            if on_device(part):
                rows.data.copy_from_device_async(source.data, source.nbytes, stream)
            else:
                # A dtype CuPy lacks (BF16) is held as the unsigned integer of its size.
                if source.dtype != rows.dtype:
                    source = source.view(rows.dtype)
                rows.set(source, stream=stream)


def c_contiguous(array: Any) -> Any:
    """``array`` (numpy or CuPy) in C order, with its shape: unlike ``ascontiguousarray``, a
    0-d array stays 0-d."""
    return array if array.flags.c_contiguous else array.copy(order="C")


def storage_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype device memory of ``dtype`` is held as: itself, or for one CuPy lacks (BF16)
    the unsigned integer of its size."""
    return dtype if dtype.kind in DEVICE_KINDS else np.dtype(f"u{dtype.itemsize}")


def fetch(
    device: Any,
    dtype: np.dtype,
    stream: Any,
    pool: HostBufferPool,
    memory: OutputMemory | None = None,
) -> np.ndarray:
    """Queue on ``stream`` the copy of the C-contiguous device array ``device`` (held as
    ``storage_dtype(dtype)``) into host memory; the returned host array of ``dtype`` is valid
    once the stream has been waited for. Outputs under ``SMALL_OUTPUT_BYTES`` get plain numpy
    memory (their copy costs less than the smallest pooled buffer would hold back), larger ones
    an array of ``memory`` when offered and it has room (a block of the executor's result arena,
    pinned: the answer is then written to the client from where the device put it, with no
    second host copy), else a buffer of ``pool``."""
    host = None
    if device.nbytes < SMALL_OUTPUT_BYTES:
        host = np.empty(device.shape, dtype=dtype)
    elif memory is not None:
        host = memory.allocate(dtype, device.shape)
    if host is None:
        host = pool.array(device.nbytes).view(dtype).reshape(device.shape)
    device.get(stream=stream, out=host.view(device.dtype), blocking=False)
    return host
