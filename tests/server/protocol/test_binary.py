"""Unit tests for server.protocol.binary: binary tensor extension and BYTES framing."""

from __future__ import annotations

import struct

import ml_dtypes
import numpy as np
import pytest

from server.errors import InvalidArgument
from server.protocol import datatypes
from server.protocol.binary import (
    deserialize_bytes,
    parse_header_length,
    serialize_bytes,
    tensor_from_bytes,
    tensor_to_bytes,
)
from server.protocol.shapes import element_count

DT = datatypes.BY_NAME


def _objects(items: list[bytes]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _frame(items: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(item)) + item for item in items)


# ---- element_count -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,count", [((), 1), ((0,), 0), ((3,), 3), ((2, 3, 4), 24), ((5, 0, 7), 0)]
)
def test_element_count(shape: tuple[int, ...], count: int) -> None:
    assert element_count(shape) == count


def test_element_count_does_not_overflow() -> None:
    assert element_count((2**40, 2**40)) == 2**80


# ---- BYTES framing -----------------------------------------------------------------------

AWKWARD = [b"", b"\x00", b"a\x00b", b"\xff\xfe", b"\x80abc", b"plain", "\u00e9".encode(), b""]


def test_serialize_bytes_layout() -> None:
    assert serialize_bytes(_objects([b"ab", b"", b"\x00"])) == (
        b"\x02\x00\x00\x00ab" + b"\x00\x00\x00\x00" + b"\x01\x00\x00\x00\x00"
    )


def test_serialize_bytes_str_elements_are_utf8() -> None:
    array = np.array(["\u00e9", "x"], dtype=object)
    assert serialize_bytes(array) == b"\x02\x00\x00\x00\xc3\xa9\x01\x00\x00\x00x"


def test_serialize_bytes_is_row_major_for_2d() -> None:
    array = _objects([b"a", b"b", b"c", b"d"]).reshape(2, 2)
    assert serialize_bytes(array.T) == _frame([b"a", b"c", b"b", b"d"])


def test_serialize_empty_tensor() -> None:
    assert serialize_bytes(np.empty((0, 3), dtype=object)) == b""


def test_bytes_round_trip_with_empty_nul_and_invalid_utf8() -> None:
    framed = serialize_bytes(_objects(AWKWARD))
    assert framed == _frame(AWKWARD)
    back = deserialize_bytes(memoryview(framed), len(AWKWARD), "IN", "m")
    assert back.dtype == object
    assert list(back) == AWKWARD
    assert all(type(item) is bytes for item in back)


def test_deserialize_zero_elements() -> None:
    back = deserialize_bytes(memoryview(b""), 0, "IN", "m")
    assert back.shape == (0,)


def test_deserialize_all_empty_elements() -> None:
    back = deserialize_bytes(memoryview(b"\x00" * 12), 3, "IN", "m")
    assert list(back) == [b"", b"", b""]


def test_deserialized_elements_do_not_alias_the_buffer() -> None:
    buffer = bytearray(_frame([b"abc"]))
    back = deserialize_bytes(memoryview(buffer), 1, "IN", "m")
    buffer[4:7] = b"xyz"
    assert back[0] == b"abc"


@pytest.mark.parametrize("cut", [1, 2, 3])
def test_truncated_length_prefix(cut: int) -> None:
    data = _frame([b"ab"]) + b"\x05\x00\x00\x00"[:cut]
    with pytest.raises(InvalidArgument) as err:
        deserialize_bytes(memoryview(data), 2, "INPUT1", "m")
    assert (
        str(err.value) == "unexpected end of BYTES data for inference input 'INPUT1' for model 'm'"
    )


def test_truncated_element() -> None:
    data = _frame([b"ab"]) + struct.pack("<I", 10) + b"abc"
    with pytest.raises(InvalidArgument) as err:
        deserialize_bytes(memoryview(data), 2, "INPUT1", "m")
    assert str(err.value) == (
        "BYTES element 1 of inference input 'INPUT1' for model 'm' claims 10 bytes but only 3 remain"
    )


def test_huge_length_claim_is_an_error_not_an_allocation() -> None:
    data = struct.pack("<I", 0xFFFFFFFF) + b"x"
    with pytest.raises(InvalidArgument, match="claims 4294967295 bytes but only 1 remain"):
        deserialize_bytes(memoryview(data), 1, "IN", "m")


def test_too_many_string_elements_triton_message() -> None:
    data = _frame([b"s"] * 18)
    with pytest.raises(InvalidArgument) as err:
        deserialize_bytes(memoryview(data), 16, "INPUT1", "model_x")
    assert str(err.value) == (
        "unexpected number of string elements 17 for inference input 'INPUT1' for model "
        "'model_x', expecting 16"
    )


def test_too_few_string_elements_triton_message() -> None:
    data = _frame([b"s"] * 14)
    with pytest.raises(InvalidArgument) as err:
        deserialize_bytes(memoryview(data), 16, "INPUT1", "model_x")
    assert str(err.value) == (
        "expected 16 string elements for inference input 'INPUT1' for model 'model_x', got 14"
    )


def test_elements_for_zero_count_refused() -> None:
    with pytest.raises(InvalidArgument, match="unexpected number of string elements 1"):
        deserialize_bytes(memoryview(_frame([b""])), 0, "IN", "m")


# ---- tensor_from_bytes -------------------------------------------------------------------

NUMERIC = [name for name in DT if name != "BYTES"]


@pytest.mark.parametrize("name", NUMERIC)
def test_tensor_from_bytes_every_numeric_type(name: str) -> None:
    dtype = DT[name].dtype
    source = (np.arange(6) % 2).astype(dtype) if name == "BOOL" else np.arange(6).astype(dtype)
    buffer = bytearray(source.tobytes())
    result = tensor_from_bytes(memoryview(buffer), DT[name], (2, 3), "IN", "m", None)
    assert result.dtype == dtype
    assert result.shape == (2, 3)
    assert np.array_equal(result.reshape(-1), source)


def test_tensor_from_bytes_is_little_endian() -> None:
    result = tensor_from_bytes(memoryview(b"\x01\x00\x00\x00"), DT["INT32"], (1,), "IN", "m", None)
    assert result.tolist() == [1]


def test_tensor_from_bytes_of_a_shape_numpy_cannot_address() -> None:
    with pytest.raises(InvalidArgument, match="causes total element count to exceed maximum size"):
        tensor_from_bytes(memoryview(b""), DT["INT32"], (0, 2**62, 2**62), "IN", "m", None)


def test_tensor_from_bytes_is_a_zero_copy_view() -> None:
    buffer = bytearray(np.arange(8, dtype=np.float32).tobytes())
    backing = np.frombuffer(buffer, dtype=np.uint8)
    result = tensor_from_bytes(memoryview(buffer), DT["FP32"], (2, 4), "IN", "m", None)
    assert np.shares_memory(result, backing)
    # Writing to the buffer shows through the tensor: nothing was copied.
    buffer[0:4] = np.float32(42.0).tobytes()
    assert result[0, 0] == 42.0


def test_tensor_from_bytes_view_of_a_slice_of_the_body() -> None:
    body = bytearray(b"HEADER" + np.arange(4, dtype=np.int16).tobytes() + b"TAIL")
    view = memoryview(body)[6:14]
    result = tensor_from_bytes(view, DT["INT16"], (4,), "IN", "m", None)
    assert result.tolist() == [0, 1, 2, 3]
    assert np.shares_memory(result, np.frombuffer(body, dtype=np.uint8))


def test_tensor_from_bytes_bf16() -> None:
    source = np.array([1.5, -2.0, 0.0078125], dtype=ml_dtypes.bfloat16)
    result = tensor_from_bytes(memoryview(source.tobytes()), DT["BF16"], (3,), "IN", "m", None)
    assert result.dtype == np.dtype(ml_dtypes.bfloat16)
    assert result.tobytes() == source.tobytes()


def test_tensor_from_bytes_empty_tensor() -> None:
    result = tensor_from_bytes(memoryview(b""), DT["FP32"], (0, 8), "IN", "m", None)
    assert result.shape == (0, 8)


def test_byte_size_mismatch_triton_message() -> None:
    data = np.zeros(10, dtype=np.float32).tobytes()
    with pytest.raises(InvalidArgument) as err:
        tensor_from_bytes(memoryview(data), DT["FP32"], (1, 8), "X", "m", "r1")
    assert (
        str(err.value)
        == "[request id: r1] input byte size mismatch for input 'X' for model 'm'. Expected 32, "
        "got 40"
    )


def test_byte_size_too_small() -> None:
    with pytest.raises(InvalidArgument, match=r"Expected 8, got 4$"):
        tensor_from_bytes(memoryview(b"\x00" * 4), DT["INT64"], (1,), "X", "m", None)


def test_absurd_shape_is_a_clean_error() -> None:
    with pytest.raises(InvalidArgument, match="input byte size mismatch"):
        tensor_from_bytes(memoryview(b"\x00" * 4), DT["FP32"], (2**4, 2**60 + 2), "X", "m", None)


def test_tensor_from_bytes_bytes_datatype() -> None:
    items = [b"\x00\xff", b"", b"ok", b"\xc3\xa9"]
    result = tensor_from_bytes(memoryview(_frame(items)), DT["BYTES"], (2, 2), "S", "m", None)
    assert result.shape == (2, 2)
    assert result.reshape(-1).tolist() == items


def test_tensor_from_bytes_bytes_count_mismatch() -> None:
    with pytest.raises(InvalidArgument, match="expected 4 string elements for inference input 'S'"):
        tensor_from_bytes(memoryview(_frame([b"a"] * 3)), DT["BYTES"], (2, 2), "S", "m", None)


# ---- tensor_to_bytes ---------------------------------------------------------------------


@pytest.mark.parametrize("name", NUMERIC)
def test_tensor_to_bytes_round_trip(name: str) -> None:
    dtype = DT[name].dtype
    source = np.arange(12).astype(dtype).reshape(3, 4)
    wire = tensor_to_bytes(source, DT[name])
    assert isinstance(wire, memoryview)
    assert wire.nbytes == 12 * dtype.itemsize
    assert bytes(wire) == source.tobytes()
    back = tensor_from_bytes(wire, DT[name], (3, 4), "O", "m", None)
    assert np.array_equal(back, source)


def test_tensor_to_bytes_contiguous_array_is_not_copied() -> None:
    source = np.arange(16, dtype=np.float32)
    wire = tensor_to_bytes(source, DT["FP32"])
    assert np.shares_memory(np.frombuffer(wire, dtype=np.uint8), source)


@pytest.mark.parametrize("name", NUMERIC)
@pytest.mark.parametrize("shape", [(0,), (2, 0, 3), ()])
def test_tensor_to_bytes_empty_and_scalar_arrays(name: str, shape: tuple[int, ...]) -> None:
    source = np.ones(shape, dtype=DT[name].dtype)
    wire = tensor_to_bytes(source, DT[name])
    assert (wire.format, wire.ndim) == ("B", 1)
    assert bytes(wire) == source.tobytes()


def test_tensor_to_bytes_non_contiguous_is_row_major() -> None:
    source = np.arange(6, dtype=np.int32).reshape(2, 3).T
    wire = tensor_to_bytes(source, DT["INT32"])
    assert np.frombuffer(wire, dtype=np.int32).tolist() == [0, 3, 1, 4, 2, 5]


def test_tensor_to_bytes_bytes_framed() -> None:
    wire = tensor_to_bytes(_objects([b"\x00\xff", b""]), DT["BYTES"])
    assert bytes(wire) == b"\x02\x00\x00\x00\x00\xff\x00\x00\x00\x00"


# ---- parse_header_length -----------------------------------------------------------------


def test_header_length_absent_is_none() -> None:
    assert parse_header_length(None, 100) is None


@pytest.mark.parametrize("value,expected", [("10", 10), ("0", 0), ("100", 100), (" 7 ", 7)])
def test_header_length_valid(value: str, expected: int) -> None:
    assert parse_header_length(value, 100) == expected


@pytest.mark.parametrize("value", ["abc", "", "1.5", "0x10", "+5", "1e3", "12abc", "\u0661\u0662"])
def test_header_length_junk(value: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_header_length(value, 100)
    assert str(err.value) == f"Unable to parse Inference-Header-Content-Length, got: {value}"


def test_header_length_negative() -> None:
    with pytest.raises(InvalidArgument, match="Inference-Header-Content-Length, got: -1$"):
        parse_header_length("-1", 100)


def test_header_length_beyond_content_length() -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_header_length("101", 100)
    assert str(err.value) == "inference header size should be in range (0, 100), got: 101"


def test_header_length_huge_is_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"should be in range \(0, 100\)"):
        parse_header_length("9" * 40, 100)


def test_tensor_to_bytes_big_endian_array_written_little_endian() -> None:
    # The wire is little-endian whatever the array's byte order.
    source = np.array([1, 2], dtype=">i4")
    assert bytes(tensor_to_bytes(source, DT["INT32"])) == b"\x01\x00\x00\x00\x02\x00\x00\x00"
