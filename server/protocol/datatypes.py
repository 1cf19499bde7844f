"""The V2 datatypes and their numpy, model-config and byte-size equivalents.

One table, used by every codec: V2 name (``"FP32"``), numpy dtype, config enum name
(``"TYPE_FP32"``). BYTES is a numpy object array of ``bytes``; BF16 uses ``ml_dtypes.bfloat16``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np

from server.errors import InvalidArgument
from server.generated import model_config_pb2 as mc


@dataclass(frozen=True)
class DataType:
    """One V2 datatype."""

    name: str  # V2 protocol name, e.g. "FP32"
    config_name: str  # model config enum name, e.g. "TYPE_FP32"
    dtype: np.dtype  # numpy dtype of a decoded tensor (object for BYTES)
    # Derived, and stored: they are read for every tensor of every request.
    is_bytes: bool = field(init=False, repr=False, compare=False)
    #: Bytes per element on the wire; 0 for BYTES, whose elements vary in size.
    itemsize: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        is_bytes = self.name == "BYTES"
        object.__setattr__(self, "is_bytes", is_bytes)
        object.__setattr__(self, "itemsize", 0 if is_bytes else self.dtype.itemsize)


def _dt(name: str, config_name: str, dtype: np.dtype | type) -> DataType:
    return DataType(name, config_name, np.dtype(dtype))


_ALL = (
    _dt("BOOL", "TYPE_BOOL", np.bool_),
    _dt("UINT8", "TYPE_UINT8", np.uint8),
    _dt("UINT16", "TYPE_UINT16", np.uint16),
    _dt("UINT32", "TYPE_UINT32", np.uint32),
    _dt("UINT64", "TYPE_UINT64", np.uint64),
    _dt("INT8", "TYPE_INT8", np.int8),
    _dt("INT16", "TYPE_INT16", np.int16),
    _dt("INT32", "TYPE_INT32", np.int32),
    _dt("INT64", "TYPE_INT64", np.int64),
    _dt("FP16", "TYPE_FP16", np.float16),
    _dt("FP32", "TYPE_FP32", np.float32),
    _dt("FP64", "TYPE_FP64", np.float64),
    _dt("BF16", "TYPE_BF16", ml_dtypes.bfloat16),
    _dt("BYTES", "TYPE_STRING", np.object_),
)

BY_NAME: dict[str, DataType] = {d.name: d for d in _ALL}
_BY_DTYPE: dict[np.dtype, DataType] = {d.dtype: d for d in _ALL}
_BY_CONFIG_ENUM: dict[int, DataType] = {mc.DataType.Value(d.config_name): d for d in _ALL}


def from_name(name: object) -> DataType:
    """The datatype for a V2 name; a 400 naming the value when it is not one."""
    if isinstance(name, str):
        found = BY_NAME.get(name)
        if found is not None:
            return found
    raise InvalidArgument(f"invalid datatype {name!r}: expected one of {', '.join(BY_NAME)}")


def from_config_enum(value: int) -> DataType:
    """The datatype for a model-config ``DataType`` enum number."""
    found = _BY_CONFIG_ENUM.get(value)
    if found is None:
        name = mc.DataType.Name(value) if value in mc.DataType.values() else value
        raise InvalidArgument(f"unsupported model config datatype {name}")
    return found


def of_output(array: np.ndarray, declared: DataType) -> DataType:
    """The datatype an output goes out as: the configured one, unless the model answered
    another (a Triton python model may: Triton sends what the model made, not its config)."""
    if array.dtype == declared.dtype or (declared.is_bytes and array.dtype == object):
        return declared
    return _BY_DTYPE.get(array.dtype, declared)


def of_dtype(dtype: np.dtype) -> DataType | None:
    """The datatype whose tensors have numpy ``dtype`` (object is BYTES), or None."""
    return _BY_DTYPE.get(dtype)
