"""Unit tests for server.ipc.tensors: descriptors packed and unpacked, and blocks of the output
arena lent to a model's run."""

from __future__ import annotations

import numpy as np
import pytest

from server.errors import InternalError
from server.ipc.messages import INLINE_BYTES, Tensor
from server.ipc.tensors import LentBlocks, Outbox, pack, unpack
from server.memory.arena import ArenaAllocator
from server.protocol.datatypes import BY_NAME

SIZE = 1 << 20
FP32 = BY_NAME["FP32"]


def lending() -> tuple[Outbox, ArenaAllocator, LentBlocks]:
    whole = np.zeros(SIZE, dtype=np.uint8)
    allocator = ArenaAllocator(SIZE)
    outbox = Outbox(whole, allocator.allocate)
    return outbox, allocator, LentBlocks(outbox, allocator.free)


def test_unpack_gives_back_what_was_packed_inline_and_past_the_start_of_the_arena() -> None:
    outbox, allocator, _ = lending()
    assert allocator.allocate(4096) == 0  # what is stored next lies past offset 0
    small = np.arange(16, dtype=np.int32).reshape(1, 16)
    large = np.arange(INLINE_BYTES, dtype=np.float32).reshape(2, -1)
    owned: list[int] = []
    for data, name in ((small, "INT32"), (large, "FP32")):
        tensor = pack("T", BY_NAME[name], data.shape, data, {}, None, outbox, owned)
        datatype, shape, got = unpack(tensor, outbox.whole, "m")
        assert datatype is BY_NAME[name] and shape == data.shape
        assert got is not None and got.dtype == data.dtype
        np.testing.assert_array_equal(got, data)
    assert tensor.inline is None and owned == [tensor.offset] and tensor.offset > 0


def test_an_output_written_into_a_lent_block_is_sent_where_it_lies() -> None:
    outbox, allocator, lent = lending()
    array = lent.allocate(np.dtype(np.float32), (4, 8192))
    assert array is not None and array.flags.c_contiguous and array.flags.writeable
    array[...] = 3.0
    owned: list[int] = []
    tensor = pack("OUTPUT0", FP32, array.shape, array, {}, None, outbox, owned)
    assert owned == []  # not copied
    assert outbox.whole[tensor.offset : tensor.offset + tensor.nbytes].view(np.float32)[0] == 3.0
    lent.hand_over([tensor])
    lent.reclaim()
    assert allocator.bytes_in_use == array.nbytes  # the front end's to release now
    allocator.free(tensor.offset)
    assert allocator.bytes_in_use == 0


def test_blocks_no_answer_carries_are_reclaimed() -> None:
    _, allocator, lent = lending()
    for _ in range(3):
        assert lent.allocate(np.dtype(np.int64), (1000,)) is not None
    lent.hand_over([Tensor("OUTPUT0", "BYTES", [1], inline=b"x")])  # (replaced, inlined)
    lent.reclaim()
    assert allocator.bytes_in_use == 0
    lent.reclaim()  # once is all: nothing is freed twice


def test_an_empty_output_takes_no_block_and_a_full_arena_gives_none() -> None:
    _, allocator, lent = lending()
    empty = lent.allocate(np.dtype(np.float32), (0, 16))
    assert empty is not None and empty.shape == (0, 16)
    assert allocator.bytes_in_use == 0
    assert lent.allocate(np.dtype(np.uint8), (2 * SIZE,)) is None


def test_a_descriptor_inside_a_lent_block_fails_before_anything_is_handed_over() -> None:
    _, allocator, lent = lending()
    first = lent.allocate(np.dtype(np.uint8), (8192,))
    second = lent.allocate(np.dtype(np.uint8), (8192,))
    assert first is not None and second is not None
    assert lent._lent is not None
    offsets = sorted(lent._lent)
    carried = Tensor("A", "UINT8", [8192], offset=offsets[0], nbytes=8192)
    inside = Tensor("B", "UINT8", [100], offset=offsets[1] + 4096, nbytes=100)
    with pytest.raises(InternalError, match="lies inside a lent block"):
        lent.hand_over([carried, inside])
    lent.reclaim()
    assert allocator.bytes_in_use == 0  # the first was not taken as handed over either
