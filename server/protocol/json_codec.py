"""JSON tensor data <-> numpy, for the ``data`` field of V2 JSON requests and responses.

Requests may nest ``data`` (row-major) or send it flat; responses are always flat. Values are
checked, not coerced: an integer type takes only JSON integers within its range, a float type
takes numbers and refuses values that overflow it, BOOL takes only true/false, BYTES only strings.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from server.errors import InvalidArgument
from server.protocol.datatypes import DataType
from server.protocol.shapes import element_count, reshape

MAX_JSON_DEPTH = 100  # Triton's limit on JSON nesting


def _flatten(data: list[Any]) -> list[Any]:
    """Row-major flattening of nested lists without recursion (depth is bounded, not the stack)."""
    if not any(type(item) is list for item in data):
        return data
    flat: list[Any] = []
    stack: list[tuple[list[Any], int]] = [(data, 0)]
    while stack:
        items, index = stack.pop()
        while index < len(items):
            item = items[index]
            index += 1
            if type(item) is list:
                if len(stack) + 2 > MAX_JSON_DEPTH:
                    raise InvalidArgument(
                        f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})"
                    )
                stack.append((items, index))
                items, index = item, 0
            else:
                flat.append(item)
    return flat


def _element_error(name: str, datatype: DataType, expected: str) -> InvalidArgument:
    return InvalidArgument(
        f"unable to parse 'data' of input '{name}': {datatype.name} elements must be {expected}"
    )


def decode_data(data: Any, datatype: DataType, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Turn the JSON ``data`` of input ``name`` into a numpy array of ``shape``."""
    if type(data) is not list:
        data = [data]
    flat = _flatten(data)
    expected = element_count(shape)
    if len(flat) > expected:
        raise InvalidArgument(
            "Unable to parse 'data': Shape does not match true shape of 'data' field "
            f"(input '{name}': {len(flat)} elements for shape {list(shape)})"
        )
    if len(flat) < expected:
        raise InvalidArgument(
            "Failed to parse 'data' field: shape does not match true shape "
            f"(input '{name}': {len(flat)} elements for shape {list(shape)})"
        )
    kinds = set(map(type, flat))
    if datatype.is_bytes:
        if not kinds <= {str}:
            raise _element_error(name, datatype, "strings")
        out = np.empty(len(flat), dtype=object)
        out[:] = [s.encode("utf-8", "surrogatepass") for s in flat]
        return reshape(out, shape, name)
    if datatype.name == "BOOL":
        if not kinds <= {bool}:
            raise _element_error(name, datatype, "true or false")
        return reshape(np.array(flat, dtype=np.bool_), shape, name)
    kind = datatype.dtype.kind
    if kind in "iu":
        if not kinds <= {int}:
            raise _element_error(name, datatype, "integers")
        return reshape(_checked_ints(flat, datatype, name), shape, name)
    if not kinds <= {int, float}:
        raise _element_error(name, datatype, "numbers")
    try:
        values = np.array(flat, dtype=np.float64) if flat else np.empty(0, np.float64)
    except OverflowError:  # an integer beyond float64
        values = np.array([np.inf])
    with np.errstate(over="ignore"):
        converted = values.astype(datatype.dtype)
    if not np.isfinite(converted).all() and np.isfinite(values).all():
        raise InvalidArgument(
            f"unable to parse 'data' of input '{name}': a value is out of range for "
            f"{datatype.name}"
        )
    return reshape(converted, shape, name)


def _checked_ints(flat: list[int], datatype: DataType, name: str) -> np.ndarray:
    if not flat:
        return np.empty(0, dtype=datatype.dtype)
    info = np.iinfo(datatype.dtype)
    # Range-check the Python ints themselves: numpy would turn a mix of small ints and
    # values above INT64_MAX into float64 and lose digits.
    if min(flat) < info.min or max(flat) > info.max:
        raise InvalidArgument(
            f"unable to parse 'data' of input '{name}': a value is out of range for "
            f"{datatype.name} [{info.min}, {info.max}]"
        )
    return np.array(flat, dtype=datatype.dtype)


def encode_data(array: np.ndarray, datatype: DataType) -> Any:
    """The flat JSON value for ``array``: a numpy array orjson can write, or a list of str.

    BYTES elements are written as text; bytes that are not UTF-8 become U+FFFD, because JSON
    strings cannot carry them. The binary format returns them exactly.
    """
    flat = array.reshape(-1)
    if datatype.is_bytes:
        return [
            item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)
            for item in flat
        ]
    if datatype.name == "BF16":
        return flat.astype(np.float32)
    return np.ascontiguousarray(flat, dtype=flat.dtype.newbyteorder("="))
