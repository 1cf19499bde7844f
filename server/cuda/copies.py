"""A batch joined on the device: each request's part copied once into its rows of one array.

GPU instances (ONNX Runtime through IO binding, python models on KIND_GPU) join their batches
here instead of concatenating them on the host first: a host part is one asynchronous copy
from its (pinned) request buffer, a device part (CUDA shared memory) one device-to-device copy,
both queued on the instance's stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from server.cuda.devices import host_array, on_device


def joined_shape(parts: Sequence[Any]) -> tuple[int, ...]:
    """The shape of ``parts`` joined along their first axis (one part: its own shape)."""
    first = parts[0]
    if len(parts) == 1:
        return tuple(first.shape)
    return (sum(part.shape[0] for part in parts), *first.shape[1:])


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
    for part, rows in zip(parts, targets, strict=True):
        if on_device(part):
            source = cupy.ascontiguousarray(part)
            rows.data.copy_from_device_async(source.data, source.nbytes, stream)
        else:
            host = np.ascontiguousarray(part)
            # A dtype CuPy lacks (BF16) is held as the unsigned integer of its size.
            rows.set(host if host.dtype == rows.dtype else host.view(rows.dtype), stream=stream)
