"""Unit tests for server.protocol.json_codec: JSON ``data`` <-> numpy, checked not coerced."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import orjson
import pytest

from server.errors import InvalidArgument
from server.protocol import datatypes
from server.protocol.json_codec import MAX_JSON_DEPTH, decode_data, encode_data

DT = datatypes.BY_NAME

# A valid flat sample of 6 elements per datatype, as a JSON decoder would produce it.
SAMPLES: dict[str, list[Any]] = {
    "BOOL": [True, False, True, True, False, False],
    "UINT8": [0, 1, 2, 127, 128, 255],
    "UINT16": [0, 1, 2, 3, 1000, 65535],
    "UINT32": [0, 1, 2, 3, 4, 4294967295],
    "UINT64": [0, 1, 2, 3, 4, 5],
    "INT8": [-128, -1, 0, 1, 2, 127],
    "INT16": [-32768, -1, 0, 1, 2, 32767],
    "INT32": [-2147483648, -1, 0, 1, 2, 2147483647],
    "INT64": [-5, -1, 0, 1, 2, 5],
    "FP16": [0.5, -1.0, 2, 3.25, 0.0, 65504.0],
    "FP32": [0.5, -1.0, 2, 3.25, 1e30, -1e-30],
    "FP64": [0.5, -1.0, 2, 3.25, 1e300, -1e-300],
    "BF16": [0.5, -1.0, 2, 3.25, 0.0, 256.0],
    "BYTES": ["a", "", "hello", "\u00e9t\u00e9", "x\u0000y", "\u65e5\u672c"],
}


def _nest(flat: list[Any]) -> list[list[Any]]:
    return [flat[0:3], flat[3:6]]


def _expected(name: str, flat: list[Any]) -> np.ndarray:
    if name == "BYTES":
        out = np.empty(len(flat), dtype=object)
        out[:] = [s.encode("utf-8") for s in flat]
        return out
    return np.array(flat, dtype=DT[name].dtype)


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_flat_data_every_datatype(name: str) -> None:
    flat = SAMPLES[name]
    result = decode_data(flat, DT[name], (2, 3), "IN")
    assert result.shape == (2, 3)
    assert result.dtype == DT[name].dtype
    assert result.reshape(-1).tolist() == _expected(name, flat).tolist()


@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_nested_data_every_datatype_is_row_major(name: str) -> None:
    flat = SAMPLES[name]
    nested = decode_data(_nest(flat), DT[name], (2, 3), "IN")
    plain = decode_data(flat, DT[name], (2, 3), "IN")
    assert nested.shape == (2, 3)
    assert nested.dtype == DT[name].dtype
    assert nested.tolist() == plain.tolist()


def test_nesting_need_not_match_shape_only_count() -> None:
    # [[1,2],[3],[[4]],5,6] flattens row-major to 1..6
    data = [[1, 2], [3], [[4]], 5, 6]
    result = decode_data(data, DT["INT32"], (3, 2), "IN")
    assert result.tolist() == [[1, 2], [3, 4], [5, 6]]


def test_scalar_json_value_for_scalar_shape() -> None:
    result = decode_data(7, DT["INT32"], (), "IN")
    assert result.shape == ()
    assert int(result) == 7


def test_single_element_for_shape_one() -> None:
    assert decode_data(3.5, DT["FP32"], (1,), "IN").tolist() == [3.5]


@pytest.mark.parametrize("name", ["INT32", "FP32", "BOOL", "BYTES", "UINT64"])
def test_empty_tensor(name: str) -> None:
    result = decode_data([], DT[name], (0, 4), "IN")
    assert result.shape == (0, 4)
    assert result.dtype == DT[name].dtype


# ---- element count mismatches, both ways -------------------------------------------------


def test_too_many_elements_message() -> None:
    with pytest.raises(InvalidArgument) as err:
        decode_data([1, 2, 3, 4, 5], DT["INT32"], (2, 2), "INPUT0")
    assert str(err.value) == (
        "Unable to parse 'data': Shape does not match true shape of 'data' field "
        "(input 'INPUT0': 5 elements for shape [2, 2])"
    )


def test_too_few_elements_message() -> None:
    with pytest.raises(InvalidArgument) as err:
        decode_data([[1], [2, 3]], DT["FP32"], (2, 2), "INPUT1")
    assert str(err.value) == (
        "Failed to parse 'data' field: shape does not match true shape "
        "(input 'INPUT1': 3 elements for shape [2, 2])"
    )


def test_data_for_empty_shape_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"1 elements for shape \[0\]"):
        decode_data([1], DT["INT32"], (0,), "X")


def test_scalar_value_for_larger_shape_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"1 elements for shape \[4\]"):
        decode_data(1, DT["INT32"], (4,), "X")


# ---- type strictness ---------------------------------------------------------------------


INT_TYPES = ["UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64"]
FLOAT_TYPES = ["FP16", "FP32", "FP64", "BF16"]


@pytest.mark.parametrize("name", INT_TYPES)
@pytest.mark.parametrize("bad", [True, False, 1.0, 0.5, "1", None])
def test_integer_types_take_only_json_integers(name: str, bad: Any) -> None:
    with pytest.raises(InvalidArgument) as err:
        decode_data([1, bad], DT[name], (2,), "X")
    assert str(err.value) == (
        f"unable to parse 'data' of input 'X': {name} elements must be integers"
    )


@pytest.mark.parametrize("bad", [1, 0, 1.0, "true", None])
def test_bool_takes_only_true_false(bad: Any) -> None:
    with pytest.raises(InvalidArgument) as err:
        decode_data([True, bad], DT["BOOL"], (2,), "B")
    assert str(err.value) == (
        "unable to parse 'data' of input 'B': BOOL elements must be true or false"
    )


@pytest.mark.parametrize("name", FLOAT_TYPES)
@pytest.mark.parametrize("bad", [True, False, "1.0", None])
def test_float_types_take_only_numbers(name: str, bad: Any) -> None:
    with pytest.raises(InvalidArgument) as err:
        decode_data([1.0, bad], DT[name], (2,), "F")
    assert str(err.value) == f"unable to parse 'data' of input 'F': {name} elements must be numbers"


@pytest.mark.parametrize("name", FLOAT_TYPES)
def test_float_types_accept_integers(name: str) -> None:
    result = decode_data([1, 2], DT[name], (2,), "F")
    assert result.dtype == DT[name].dtype
    assert result.astype(np.float64).tolist() == [1.0, 2.0]


@pytest.mark.parametrize("bad", [1, 1.5, True, None, ["nested-list-is-ok-but-not-this", 3]])
def test_bytes_take_only_strings(bad: Any) -> None:
    with pytest.raises(InvalidArgument) as err:
        decode_data(["a", bad], DT["BYTES"], (2,) if not isinstance(bad, list) else (3,), "S")
    assert str(err.value) == "unable to parse 'data' of input 'S': BYTES elements must be strings"


def test_bytes_are_utf8_encoded_strings() -> None:
    result = decode_data(["\u00e9", "\u2603", "plain", ""], DT["BYTES"], (4,), "S")
    assert result.dtype == object
    assert list(result) == ["\u00e9".encode(), "\u2603".encode(), b"plain", b""]
    assert all(type(item) is bytes for item in result)


def test_bytes_lone_surrogate_from_json_is_kept() -> None:
    # orjson refuses lone surrogates, but a str reaching the codec must not crash it.
    result = decode_data(["\ud800"], DT["BYTES"], (1,), "S")
    assert result[0] == "\ud800".encode("utf-8", "surrogatepass")


# ---- integer ranges ----------------------------------------------------------------------


@pytest.mark.parametrize("name", INT_TYPES)
def test_integer_limits_accepted(name: str) -> None:
    info = np.iinfo(DT[name].dtype)
    result = decode_data([int(info.min), int(info.max)], DT[name], (2,), "X")
    assert result.dtype == DT[name].dtype
    assert [int(v) for v in result] == [int(info.min), int(info.max)]


@pytest.mark.parametrize("name", INT_TYPES)
@pytest.mark.parametrize("side", ["below", "above"])
def test_integer_out_of_range_refused_not_wrapped(name: str, side: str) -> None:
    info = np.iinfo(DT[name].dtype)
    value = int(info.min) - 1 if side == "below" else int(info.max) + 1
    with pytest.raises(InvalidArgument) as err:
        decode_data([0, value], DT[name], (2,), "X")
    assert str(err.value) == (
        f"unable to parse 'data' of input 'X': a value is out of range for {name} "
        f"[{int(info.min)}, {int(info.max)}]"
    )


def test_int8_300_refused() -> None:
    with pytest.raises(InvalidArgument, match=r"out of range for INT8 \[-128, 127\]"):
        decode_data([300], DT["INT8"], (1,), "X")


def test_uint64_max_alone() -> None:
    result = decode_data([2**64 - 1], DT["UINT64"], (1,), "X")
    assert result.dtype == np.uint64
    assert int(result[0]) == 2**64 - 1


def test_uint64_max_with_other_values() -> None:
    # json of [18446744073709551615, 0] -> both exact
    values = orjson.loads(b"[18446744073709551615, 0, 1]")
    result = decode_data(values, DT["UINT64"], (3,), "X")
    assert result.dtype == np.uint64
    assert [int(v) for v in result] == [2**64 - 1, 0, 1]


def test_uint64_above_int64_is_exact() -> None:
    # Values above 2**63 must not go through float64 (2**63 + 1 is not a float64).
    values = [2**63 + 1, 5]
    result = decode_data(values, DT["UINT64"], (2,), "X")
    assert [int(v) for v in result] == values


def test_int64_min_and_max_exact() -> None:
    values = orjson.loads(b"[-9223372036854775808, 9223372036854775807, 0]")
    result = decode_data(values, DT["INT64"], (3,), "X")
    assert result.dtype == np.int64
    assert [int(v) for v in result] == [-(2**63), 2**63 - 1, 0]


def test_int64_below_min_refused() -> None:
    with pytest.raises(InvalidArgument, match="out of range for INT64"):
        decode_data([-(2**63) - 1], DT["INT64"], (1,), "X")


def test_integer_beyond_64_bits_refused() -> None:
    with pytest.raises(InvalidArgument, match="out of range for UINT64"):
        decode_data([2**64], DT["UINT64"], (1,), "X")
    with pytest.raises(InvalidArgument, match="out of range for INT64"):
        decode_data([2**70, -(2**70)], DT["INT64"], (2,), "X")


# ---- float ranges ------------------------------------------------------------------------


def test_fp32_overflow_refused() -> None:
    with pytest.raises(InvalidArgument) as err:
        decode_data([1.0, 1e39], DT["FP32"], (2,), "F")
    assert str(err.value) == "unable to parse 'data' of input 'F': a value is out of range for FP32"


def test_fp32_negative_overflow_refused() -> None:
    with pytest.raises(InvalidArgument, match="out of range for FP32"):
        decode_data([-1e39], DT["FP32"], (1,), "F")


def test_fp16_overflow_refused() -> None:
    with pytest.raises(InvalidArgument, match="out of range for FP16"):
        decode_data([70000.0], DT["FP16"], (1,), "F")


def test_fp32_max_accepted_and_fp64_large_accepted() -> None:
    fmax = float(np.finfo(np.float32).max)
    assert decode_data([fmax], DT["FP32"], (1,), "F")[0] == np.float32(fmax)
    assert decode_data([1e300], DT["FP64"], (1,), "F")[0] == 1e300


def test_fp32_underflow_to_zero_is_not_an_error() -> None:
    assert decode_data([1e-50], DT["FP32"], (1,), "F").tolist() == [0.0]


def test_fp16_accepted_in_json() -> None:
    result = decode_data([[1.5, -2.0], [0.25, 65504]], DT["FP16"], (2, 2), "H")
    assert result.dtype == np.float16
    assert result.tolist() == [[1.5, -2.0], [0.25, 65504.0]]


def test_bf16_accepted_in_json() -> None:
    result = decode_data([1.5, -2.0, 3.0e38], DT["BF16"], (3,), "H")
    assert result.dtype == np.dtype(ml_dtypes.bfloat16)
    assert result.astype(np.float32)[:2].tolist() == [1.5, -2.0]
    assert np.isfinite(result.astype(np.float32)).all()


def test_float_values_are_the_nearest_representable() -> None:
    result = decode_data([0.1], DT["FP32"], (1,), "F")
    assert result[0] == np.float32(0.1)


# ---- nesting depth -----------------------------------------------------------------------


def _deep(depth: int) -> list[Any]:
    """``depth`` levels of list around the value 1 (depth 1 is [1])."""
    data: list[Any] = [1]
    for _ in range(depth - 1):
        data = [data]
    return data


def test_nesting_of_100_accepted() -> None:
    assert MAX_JSON_DEPTH == 100
    assert decode_data(_deep(100), DT["INT32"], (1,), "X").tolist() == [1]


@pytest.mark.parametrize("depth", [101, 102, 5000])
def test_nesting_deeper_than_100_refused(depth: int) -> None:
    with pytest.raises(InvalidArgument) as err:
        decode_data(_deep(depth), DT["INT32"], (1,), "X")
    assert str(err.value) == "JSON nesting depth exceeds maximum allowed limit (100)"


def test_deep_nesting_in_a_later_element_refused() -> None:
    data = [1, 2, _deep(150)]
    with pytest.raises(InvalidArgument, match=r"maximum allowed limit \(100\)"):
        decode_data(data, DT["INT32"], (3,), "X")


def test_deep_nesting_does_not_hit_the_python_stack() -> None:
    # 100000 levels would overflow a recursive flattener; must be a clean 400.
    with pytest.raises(InvalidArgument, match="nesting depth"):
        decode_data(_deep(100_000), DT["INT32"], (1,), "X")


# ---- encode_data -------------------------------------------------------------------------


@pytest.mark.parametrize("name", [n for n in sorted(SAMPLES) if n not in ("BYTES", "BF16")])
def test_encode_numeric_is_flat_contiguous_and_serialisable(name: str) -> None:
    array = decode_data(SAMPLES[name], DT[name], (2, 3), "X")
    encoded = encode_data(array, DT[name])
    assert isinstance(encoded, np.ndarray)
    assert encoded.ndim == 1 and encoded.shape == (6,)
    assert encoded.dtype == DT[name].dtype
    assert encoded.flags.c_contiguous
    written = orjson.loads(orjson.dumps(encoded, option=orjson.OPT_SERIALIZE_NUMPY))
    # orjson writes the shortest text for the dtype; reading it back as that dtype is exact.
    assert np.array_equal(np.array(written, dtype=DT[name].dtype), array.reshape(-1))


def test_encode_non_contiguous_array_row_major() -> None:
    array = np.arange(6, dtype=np.int32).reshape(2, 3).T  # Fortran-ordered view
    encoded = encode_data(array, DT["INT32"])
    assert encoded.flags.c_contiguous
    assert encoded.tolist() == [0, 3, 1, 4, 2, 5]


def test_encode_bool_as_json_booleans() -> None:
    encoded = encode_data(np.array([[True, False]]), DT["BOOL"])
    assert orjson.dumps(encoded, option=orjson.OPT_SERIALIZE_NUMPY) == b"[true,false]"


def test_encode_bf16_as_float32() -> None:
    array = np.array([[1.5, -2.0]], dtype=ml_dtypes.bfloat16)
    encoded = encode_data(array, DT["BF16"])
    assert encoded.dtype == np.float32
    assert orjson.dumps(encoded, option=orjson.OPT_SERIALIZE_NUMPY) == b"[1.5,-2.0]"


def test_encode_bytes_as_strings() -> None:
    array = np.empty((2, 2), dtype=object)
    array[:] = [[b"abc", "\u00e9".encode()], [b"", b"a\x00b"]]
    encoded = encode_data(array, DT["BYTES"])
    assert encoded == ["abc", "\u00e9", "", "a\x00b"]
    assert orjson.dumps(encoded) == b'["abc","\xc3\xa9","","a\\u0000b"]'


def test_encode_bytes_invalid_utf8_becomes_replacement_character() -> None:
    array = np.empty(1, dtype=object)
    array[0] = b"a\xffb"
    assert encode_data(array, DT["BYTES"]) == ["a\ufffdb"]


def test_encode_bytes_str_elements_passed_through() -> None:
    array = np.array(["x", "y"], dtype=object)
    assert encode_data(array, DT["BYTES"]) == ["x", "y"]


def test_decode_then_encode_round_trip_bytes() -> None:
    strings = ["one", "", "\u00fc\u00f1\u00ee", "nul\u0000in"]
    array = decode_data(strings, DT["BYTES"], (4,), "S")
    assert encode_data(array, DT["BYTES"]) == strings


def test_encode_big_endian_array_is_serialisable() -> None:
    # A big-endian array's JSON must still be writable by orjson.
    array = np.array([1.5, -2.0], dtype=">f8")
    encoded = encode_data(array, DT["FP64"])
    assert orjson.dumps(encoded, option=orjson.OPT_SERIALIZE_NUMPY) == b"[1.5,-2.0]"
