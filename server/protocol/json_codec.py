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

MAX_JSON_DEPTH = 100  # Triton's limit on JSON nesting


def _flatten(data: list[Any], name: str) -> list[Any]:
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
    flat = _flatten(data, name)
    expected = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if len(flat) > expected:
        raise InvalidArgument(
            f"Unable to parse 'data' of input '{name}': Shape does not match true shape of "
            f"'data' field ({len(flat)} elements for shape {list(shape)})"
        )
    if len(flat) < expected:
        raise InvalidArgument(
            f"Failed to parse 'data' field of input '{name}': shape does not match true shape "
            f"({len(flat)} elements for shape {list(shape)})"
        )
    kinds = set(map(type, flat))
    if datatype.is_bytes:
        if not kinds <= {str}:
            raise _element_error(name, datatype, "strings")
        out = np.empty(len(flat), dtype=object)
        out[:] = [s.encode("utf-8", "surrogatepass") for s in flat]
        return out.reshape(shape)
    if datatype.name == "BOOL":
        if not kinds <= {bool}:
            raise _element_error(name, datatype, "true or false")
        return np.array(flat, dtype=np.bool_).reshape(shape)
    kind = datatype.dtype.kind
    if kind in "iu":
        if not kinds <= {int}:
            raise _element_error(name, datatype, "integers")
        return _checked_ints(flat, datatype, name).reshape(shape)
    if not kinds <= {int, float}:
        raise _element_error(name, datatype, "numbers")
    values = np.array(flat, dtype=np.float64) if flat else np.empty(0, np.float64)
    converted = values.astype(datatype.dtype)
    if not np.isfinite(converted).all() and np.isfinite(values).all():
        raise InvalidArgument(
            f"unable to parse 'data' of input '{name}': a value is out of range for "
            f"{datatype.name}"
        )
    return converted.reshape(shape)


def _checked_ints(flat: list[int], datatype: DataType, name: str) -> np.ndarray:
    info = np.iinfo(datatype.dtype)
    if not flat:
        return np.empty(0, dtype=datatype.dtype)
    try:
        values = np.array(flat)
    except OverflowError:
        values = np.array(flat, dtype=object)
    if values.dtype == object or int(values.min()) < info.min or int(values.max()) > info.max:
        raise InvalidArgument(
            f"unable to parse 'data' of input '{name}': a value is out of range for "
            f"{datatype.name} [{info.min}, {info.max}]"
        )
    return values.astype(datatype.dtype)


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
    return np.ascontiguousarray(flat)
