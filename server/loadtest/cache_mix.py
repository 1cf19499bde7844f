"""``--cache-hit-ratio``: a mix of requests that the server's response cache answers and
requests it has never seen, in a given proportion.

A fraction ``hit_ratio`` of the requests are the sweep's one request, always the same bytes
(after its first answer, cache hits); the others are that request with a counter written into
the first elements of one numeric input, so each is new to the cache (a miss). The counter is
written in the input's own datatype and value range (integers in [0, 64) as base-64 digits,
floats in [0, 1) as multiples of 2^-24) and starts at a random point in each client
process, so processes do not repeat each other. The place to write is found by encoding the
request a second time with those elements' bytes flipped: the only bytes that differ.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from server.loadtest.errors import UsageError
from server.loadtest.inputs import Tensor

#: Per datatype kind: (largest number of elements the counter takes, base of each digit).
_DIGITS = {"i": (8, 64), "u": (8, 64), "f": (2, 1 << 24)}


@dataclass(frozen=True)
class CacheMix:
    """Where and how fresh requests differ from the fixed one (picklable, for the workers)."""

    hit_ratio: float
    offset: int  # of the first patched byte in the encoded request
    dtype: str  # numpy dtype string of the patched elements
    digits: int
    base: int


def plan(
    hit_ratio: float,
    tensors: Sequence[Tensor],
    encode: Callable[[Sequence[Tensor]], bytes],
) -> CacheMix:
    """The mix for the request ``encode(tensors)`` makes; ``UsageError`` when no input can
    carry a counter (BOOL, BYTES, FP16 and BF16 inputs only, or too few elements)."""
    for index, tensor in enumerate(tensors):
        kind = tensor.array.dtype.kind
        if kind not in _DIGITS or tensor.datatype.name in ("FP16", "BF16"):
            continue
        most, base = _DIGITS[kind]
        digits = min(most, tensor.array.size)
        flat = np.ascontiguousarray(tensor.array).reshape(-1)
        flipped = flat.copy()
        width = digits * flat.itemsize
        raw = flipped.view(np.uint8)
        raw[:width] ^= 0xFF
        variant = [*tensors[:index], Tensor(tensor.name, tensor.datatype,
                                            flipped.reshape(tensor.array.shape)),
                   *tensors[index + 1:]]
        original, changed = encode(tensors), encode(variant)
        differ = [i for i, (a, b) in enumerate(zip(original, changed, strict=True)) if a != b]
        if len(original) != len(changed) or differ != list(range(differ[0], differ[0] + width)):
            raise UsageError("--cache-hit-ratio: cannot locate the input's bytes in the request")
        return CacheMix(hit_ratio, differ[0], flat.dtype.str, digits, base)
    raise UsageError(
        "--cache-hit-ratio needs an integer, FP32 or FP64 input to vary (the request's inputs "
        "are all BOOL, BYTES, FP16 or BF16)"
    )


class RequestStream:
    """The requests one generator sends, in order: ``next()`` each time."""

    def __init__(self, request: bytes, mix: CacheMix | None) -> None:
        self._request = request
        self._mix = mix
        self._sent = 0
        if mix is not None:
            capacity = mix.base**mix.digits
            self._counter = int.from_bytes(os.urandom(8), "little") % capacity
            self._template = bytearray(request)
            self._dtype = np.dtype(mix.dtype)
            self._powers = np.array([mix.base**i for i in range(mix.digits)], dtype=np.int64)

    def next(self) -> bytes:
        mix = self._mix
        if mix is None:
            return self._request
        self._sent += 1
        # Exactly ``hit_ratio`` of every run of requests are the fixed one, spread evenly.
        if int(self._sent * mix.hit_ratio) > int((self._sent - 1) * mix.hit_ratio):
            return self._request
        self._counter += 1
        digits = (self._counter // self._powers) % mix.base
        values = digits / mix.base if self._dtype.kind == "f" else digits
        start = mix.offset
        patch = values.astype(self._dtype).tobytes()
        self._template[start:start + len(patch)] = patch
        return bytes(self._template)
