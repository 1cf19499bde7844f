"""The response cache (``--cache-config local,size=N``): one pool of answers shared by every
model whose config has ``response_cache { enable: true }``.

A repeated request is answered from here without running the model. Triton keys an entry on
the model name, version and each input's name and bytes (``TritonCache::Hash``); this key
also covers each input's datatype and shape, the outputs asked for with their class counts
and the request parameters a model can read, so two requests that could be answered
differently never share an entry. Entries are copies, never views of request or model
buffers, and the pool is bounded in bytes with least recently used eviction, as Triton's
local cache is.

Threading: ``lookup`` and ``insert`` run on the event loop thread only (no lock); ``key`` is
pure and may run on a worker thread for large inputs.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from server.protocol.binary import tensor_to_bytes
from server.protocol.types import InputTensor, OutputTensor

#: Request parameters that only steer scheduling or the wire encoding, never the outputs.
UNKEYED_PARAMETERS = frozenset({"priority", "timeout", "binary_data_output"})
#: Bookkeeping bytes charged per entry beyond its tensors' bytes (key, records).
ENTRY_OVERHEAD = 256


def key(
    model: str,
    version: int,
    load: int,
    inputs: Iterable[InputTensor],
    outputs: Mapping[str, int],
    parameters: Mapping[str, object],
) -> bytes:
    """The digest identifying a request's answer. ``outputs``: output names asked for, each
    with its class count (0: the tensor itself). Inputs are taken in name order, so their
    order in the request does not matter; every field is length-framed, so no two different
    requests serialise alike. ``load`` tells loads of one version apart: a reload with new
    weights must not be answered from the old ones' entries."""
    digest = hashlib.blake2b(digest_size=32)

    def field(data: bytes | memoryview) -> None:
        digest.update(len(data).to_bytes(8, "little"))
        digest.update(data)

    field(model.encode())
    field(str(version).encode())
    field(str(load).encode())
    ordered = sorted(inputs, key=lambda t: t.name)
    field(str(len(ordered)).encode())
    for tensor in ordered:
        field(tensor.name.encode())
        field(tensor.datatype.name.encode())
        field(",".join(str(d) for d in tensor.shape).encode())
        field(tensor_to_bytes(tensor.data, tensor.datatype))
    field(repr(sorted(outputs.items())).encode())
    kept = sorted((k, repr(v)) for k, v in parameters.items() if k not in UNKEYED_PARAMETERS)
    field(repr(kept).encode())
    return digest.digest()


@dataclass(frozen=True, slots=True)
class _Entry:
    outputs: tuple[OutputTensor, ...]
    size: int


def _copy(outputs: Iterable[OutputTensor]) -> tuple[OutputTensor, ...]:
    return tuple(
        OutputTensor(o.name, o.datatype, o.shape, np.array(o.data, copy=True)) for o in outputs
    )


def _size(outputs: Sequence[OutputTensor]) -> int:
    """The bytes an entry holds: numeric tensors' buffers, BYTES elements' lengths."""
    total = ENTRY_OVERHEAD
    for output in outputs:
        if output.datatype.is_bytes:
            total += sum(len(e) + 8 for e in output.data.reshape(-1))
        else:
            total += output.data.nbytes
    return total


class ResponseCache:
    """Answers by key, at most ``capacity`` bytes in all, least recently used out first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def utilization(self) -> float:
        """The fraction of the capacity in use, 0 to 1 (Triton's ``nv_cache_util``)."""
        return self.used / self.capacity if self.capacity else 0.0

    def lookup(self, digest: bytes) -> tuple[OutputTensor, ...] | None:
        """A fresh copy of the answer stored under ``digest`` (it becomes the most recently
        used), or None."""
        entry = self._entries.get(digest)
        if entry is None:
            return None
        self._entries.move_to_end(digest)
        return _copy(entry.outputs)

    def insert(self, digest: bytes, outputs: Sequence[OutputTensor]) -> bool:
        """Store a copy of ``outputs``, evicting the least recently used entries to make room.
        An answer larger than the whole cache is not stored (False), and nothing is evicted."""
        size = _size(outputs)
        if size > self.capacity:
            return False
        old = self._entries.pop(digest, None)
        if old is not None:
            self.used -= old.size
        while self.used + size > self.capacity:
            _, evicted = self._entries.popitem(last=False)
            self.used -= evicted.size
        self._entries[digest] = _Entry(_copy(outputs), size)
        self.used += size
        return True
