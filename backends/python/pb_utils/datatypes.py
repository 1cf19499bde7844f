"""Triton's datatype helpers for python models: config type names and numbers <-> numpy.

Numbers are the model config's ``DataType`` enum (``TYPE_BOOL`` = 1 ... ``TYPE_STRING`` = 13,
``TYPE_BF16`` = 14); BYTES (``TYPE_STRING``) is a numpy object array of ``bytes``. BF16 has no
numpy dtype of its own: it maps to ``ml_dtypes.bfloat16``, which Triton's module leaves out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from server.errors import InvalidArgument
from server.generated import model_config_pb2 as mc
from server.protocol.binary import deserialize_bytes, serialize_bytes
from server.protocol.datatypes import BY_NAME

#: Config type name -> numpy type, as models look it up (``TYPE_STRING`` is ``np.object_``).
TRITON_STRING_TO_NUMPY: dict[str, Any] = {
    datatype.config_name: (bool if datatype.name == "BOOL" else datatype.dtype.type)
    for datatype in BY_NAME.values()
    if datatype.name != "BF16"
}
_NUMBER_TO_NUMPY: dict[int, Any] = {
    mc.DataType.Value(datatype.config_name): datatype.dtype.type for datatype in BY_NAME.values()
}
_NUMPY_TO_NUMBER: dict[np.dtype, int] = {
    datatype.dtype: mc.DataType.Value(datatype.config_name) for datatype in BY_NAME.values()
}


def triton_string_to_numpy(triton_type_string: str) -> Any:
    """``"TYPE_FP32"`` -> ``np.float32``; a KeyError for a name that is not a type."""
    return TRITON_STRING_TO_NUMPY[triton_type_string]


def triton_to_numpy_type(data_type: int) -> Any:
    """A config ``DataType`` number -> numpy type; None for one without a numpy type."""
    return _NUMBER_TO_NUMPY.get(data_type)


def numpy_to_triton_type(data_type: Any) -> int | None:
    """A numpy dtype or type -> config ``DataType`` number (``np.bytes_`` and ``np.object_``
    are ``TYPE_STRING``); None for one Triton has no type for."""
    try:
        dtype = np.dtype(data_type)
    except TypeError:
        return None
    if dtype.kind in ("S", "O"):
        return mc.TYPE_STRING
    return _NUMPY_TO_NUMBER.get(dtype)


def serialize_byte_tensor(input_tensor: np.ndarray) -> bytes | None:
    """A BYTES array (object or ``np.bytes_``) as one buffer: each element in C order as a
    4-byte little-endian length and its bytes (``str`` elements UTF-8 encoded). None for an
    array of another dtype."""
    if input_tensor.dtype.kind not in ("O", "S"):
        return None
    return serialize_bytes(input_tensor)


def deserialize_bytes_tensor(encoded_tensor: bytes | bytearray | memoryview) -> np.ndarray:
    """The inverse of ``serialize_byte_tensor``: a flat object array of ``bytes``. Raises
    ``ValueError`` for a buffer that ends inside an element."""
    view = memoryview(encoded_tensor).cast("B")
    try:
        return _split(view)
    except InvalidArgument as exc:
        raise ValueError(exc.message) from None


def _split(view: memoryview) -> np.ndarray:
    count, offset = 0, 0
    while offset + 4 <= len(view):  # count first: deserialize_bytes checks the count
        offset += 4 + int.from_bytes(view[offset : offset + 4], "little")
        count += 1
    return deserialize_bytes(view, count, "encoded_tensor", "python model")
