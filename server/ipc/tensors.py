"""Tensors to descriptors and back.

The sender of a tensor leaves it where it is when it already lies in its own arena (an HTTP
body received into it, or a model output written into a block lent to the run: ``LentBlocks``),
copies it into a block of its arena when it is large, and sends small ones and BYTES inline.
The receiver views the sender's arena at the descriptor's offset: no copy. A descriptor that
does not fit the arena or its shape is a bug of the sender and fails that request alone
(``InternalError``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from server.errors import InternalError
from server.ipc.messages import INLINE_BYTES, Tensor
from server.protocol.binary import deserialize_bytes, serialize_bytes
from server.protocol.datatypes import BY_NAME, DataType
from server.protocol.shapes import element_count
from server.protocol.shared_memory_params import SharedMemoryRef
from server.protocol.types import Parameters

#: Allocates a block of this many bytes of the sender's arena: its offset, None when full.
Allocate = Callable[[int], "int | None"]


class Outbox:
    """The sender's side of its arena: ``whole`` is the mapping, ``allocate`` its allocator."""

    def __init__(self, whole: np.ndarray, allocate: Allocate) -> None:
        self.whole = whole
        self._allocate = allocate
        self._start = int(whole.ctypes.data)
        self._end = self._start + whole.nbytes

    def offset_of(self, data: np.ndarray) -> int | None:
        """Where ``data`` lies in the arena, when it lies there as one contiguous run."""
        if not data.flags.c_contiguous:
            return None
        start = int(data.ctypes.data) if data.nbytes else 0
        if self._start <= start and start + data.nbytes <= self._end:
            return start - self._start
        return None

    def copy_bytes(self, arrays: list[np.ndarray | None]) -> int:
        """How many bytes ``pack`` will copy for these tensors (small ones, inlined, and those
        not in the arena): the size that decides whether packing runs off the event loop."""
        total = 0
        for a in arrays:  # a loop: no generator per request
            if a is not None and (a.nbytes <= INLINE_BYTES or self.offset_of(a) is None):
                total += a.nbytes
        return total

    def array(self, dtype: np.dtype, shape: tuple[int, ...]) -> tuple[int, np.ndarray] | None:
        """A new block viewed as an array of ``dtype`` and ``shape``: its offset (the caller
        frees it) and the array; None when the arena is full."""
        nbytes = math.prod(shape) * dtype.itemsize
        offset = self._allocate(nbytes)
        if offset is None:
            return None
        return offset, self.whole[offset : offset + nbytes].view(dtype).reshape(shape)

    def store(self, data: np.ndarray) -> int | None:
        """Copy ``data`` into a new block: its offset (the caller frees it), None when full."""
        block = self.array(data.dtype, data.shape)
        if block is None:
            return None
        np.copyto(block[1], data, casting="no")
        return block[0]


class LentBlocks:
    """Blocks of the arena lent to one request's model run for its outputs
    (``backends.base.OutputMemory``; called from the instance's thread). Those the answer's
    descriptors carry go to the front end, which releases them (``hand_over``); ``reclaim``
    frees the rest: outputs not asked for in the end, replaced (classification), or the
    request failed. Made for every request, and nearly always left unused: kept cheap."""

    __slots__ = ("_free", "_lent", "_outbox")

    def __init__(self, outbox: Outbox, free: Callable[[int], None]) -> None:
        self._outbox = outbox
        self._free = free
        self._lent: dict[int, int] | None = None  # offset -> bytes, lent, not handed over

    def allocate(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:
        if math.prod(shape) == 0:
            return np.empty(shape, dtype)
        block = self._outbox.array(dtype, shape)
        if block is None:
            return None
        offset, array = block
        if self._lent is None:
            self._lent = {}
        self._lent[offset] = array.nbytes
        return array

    def hand_over(self, tensors: Sequence[Tensor]) -> None:
        """``tensors`` (descriptors being sent) carry the blocks they point at. One pointing
        inside a lent block, not at its start, could not be released by the front end: a bug,
        failing the request before anything is sent."""
        lent = self._lent
        if lent is None:
            return
        for tensor in tensors:
            offset = tensor.offset
            if offset not in lent and any(start < offset < start + n for start, n in lent.items()):
                raise InternalError(f"output '{tensor.name}' lies inside a lent block")
        for tensor in tensors:
            lent.pop(tensor.offset, None)

    def reclaim(self) -> None:
        """Free every block not handed over."""
        lent, self._lent = self._lent, None
        if lent is not None:
            for offset in lent:
                self._free(offset)


def shm_tuple(ref: SharedMemoryRef | None) -> tuple[str, int, int] | None:
    return None if ref is None else (ref.region, ref.offset, ref.byte_size)


def shm_ref(value: tuple[str, int, int] | None) -> SharedMemoryRef | None:
    return None if value is None else SharedMemoryRef(*value)


def pack(
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    data: np.ndarray | None,
    parameters: Parameters,
    shm: SharedMemoryRef | None,
    outbox: Outbox,
    owned: list[int],
) -> Tensor:
    """The descriptor of one tensor; blocks it had to allocate are appended to ``owned``."""
    dims = list(shape)
    if shm is not None or data is None:
        return Tensor(name, datatype.name, dims, parameters, shm=shm_tuple(shm))
    if datatype.is_bytes:
        return Tensor(name, datatype.name, dims, parameters, inline=serialize_bytes(data))
    if data.dtype.byteorder == ">":
        data = data.astype(data.dtype.newbyteorder("<"))
    if data.nbytes <= INLINE_BYTES:
        return Tensor(name, datatype.name, dims, parameters, inline=data.tobytes())
    offset = outbox.offset_of(data)
    if offset is None:
        offset = outbox.store(np.ascontiguousarray(data))
        if offset is None:  # the arena is full: the bytes go through the socket
            return Tensor(name, datatype.name, dims, parameters, inline=data.tobytes())
        owned.append(offset)
    return Tensor(name, datatype.name, dims, parameters, offset=offset, nbytes=data.nbytes)


def unpack(tensor: Tensor, peer: np.ndarray, model: str) -> tuple[DataType, tuple[int, ...], np.ndarray | None]:
    """Datatype, shape and data (None: in a client's shared memory region) of a descriptor;
    the data views ``peer`` (the sender's arena) or the message's inline bytes."""
    datatype = BY_NAME.get(tensor.datatype)
    shape = tuple(tensor.shape)
    if datatype is None or (shape and min(shape) < 0):
        raise InternalError(f"malformed tensor descriptor for '{tensor.name}'")
    if tensor.shm is not None:
        return datatype, shape, None
    count = element_count(shape)
    inline = tensor.inline
    if inline is not None:
        if datatype.is_bytes:
            data = deserialize_bytes(memoryview(inline), count, tensor.name, model)
            return datatype, shape, data.reshape(shape)
        nbytes = len(inline)
    else:
        nbytes = tensor.nbytes
        if tensor.offset < 0 or tensor.offset + nbytes > peer.nbytes:
            raise InternalError(f"tensor descriptor for '{tensor.name}' lies outside the arena")
    if datatype.is_bytes or nbytes != count * datatype.itemsize:
        raise InternalError(f"tensor descriptor for '{tensor.name}' does not match its shape")
    # One array of the final shape straight over the bytes (half the cost of a flat array
    # and a reshape, on every tensor of every request both ways).
    if inline is not None:
        return datatype, shape, np.ndarray(shape, datatype.dtype, inline)
    return datatype, shape, np.ndarray(shape, datatype.dtype, peer, tensor.offset)
