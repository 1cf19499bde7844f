"""Unit tests for server.protocol.datatypes: the one V2 datatype table."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from server.errors import InvalidArgument
from server.generated import model_config_pb2 as mc
from server.protocol import datatypes

# V2 name -> (config enum name, numpy dtype, wire item size)
EXPECTED = {
    "BOOL": ("TYPE_BOOL", np.dtype(np.bool_), 1),
    "UINT8": ("TYPE_UINT8", np.dtype(np.uint8), 1),
    "UINT16": ("TYPE_UINT16", np.dtype(np.uint16), 2),
    "UINT32": ("TYPE_UINT32", np.dtype(np.uint32), 4),
    "UINT64": ("TYPE_UINT64", np.dtype(np.uint64), 8),
    "INT8": ("TYPE_INT8", np.dtype(np.int8), 1),
    "INT16": ("TYPE_INT16", np.dtype(np.int16), 2),
    "INT32": ("TYPE_INT32", np.dtype(np.int32), 4),
    "INT64": ("TYPE_INT64", np.dtype(np.int64), 8),
    "FP16": ("TYPE_FP16", np.dtype(np.float16), 2),
    "FP32": ("TYPE_FP32", np.dtype(np.float32), 4),
    "FP64": ("TYPE_FP64", np.dtype(np.float64), 8),
    "BF16": ("TYPE_BF16", np.dtype(ml_dtypes.bfloat16), 2),
    "BYTES": ("TYPE_STRING", np.dtype(object), 0),
}


def test_table_has_exactly_the_v2_datatypes() -> None:
    assert set(datatypes.BY_NAME) == set(EXPECTED)
    assert {d.config_name for d in datatypes.BY_NAME.values()} == {
        v[0] for v in EXPECTED.values()
    }


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_datatype_row(name: str) -> None:
    config_name, dtype, itemsize = EXPECTED[name]
    dt = datatypes.BY_NAME[name]
    assert dt.name == name
    assert dt.config_name == config_name
    assert dt.dtype == dtype
    assert dt.itemsize == itemsize
    assert dt.is_bytes == (name == "BYTES")


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_config_names_are_real_model_config_enum_values(name: str) -> None:
    config_name = EXPECTED[name][0]
    # Raises ValueError if the proto does not define the name.
    mc.DataType.Value(config_name)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_from_name_returns_the_shared_instance(name: str) -> None:
    assert datatypes.from_name(name) is datatypes.BY_NAME[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_from_config_enum_round_trip(name: str) -> None:
    value = mc.DataType.Value(EXPECTED[name][0])
    assert datatypes.from_config_enum(value) is datatypes.BY_NAME[name]


@pytest.mark.parametrize(
    "bad", ["fp32", "FLOAT", "TYPE_FP32", "STRING", "", " FP32", 5, None, True, ["FP32"]]
)
def test_from_name_refuses_everything_else(bad: object) -> None:
    with pytest.raises(InvalidArgument) as err:
        datatypes.from_name(bad)
    message = str(err.value)
    assert message.startswith(f"invalid datatype {bad!r}: expected one of ")
    assert "FP32" in message and "BYTES" in message
    assert err.value.http_status == 400


@pytest.mark.parametrize(("bad", "shown"), [(0, "TYPE_INVALID"), (999, "999")])
def test_from_config_enum_refuses_unknown(bad: int, shown: str) -> None:
    with pytest.raises(InvalidArgument, match=f"unsupported model config datatype {shown}$"):
        datatypes.from_config_enum(bad)


def test_datatype_is_frozen() -> None:
    dt = datatypes.BY_NAME["FP32"]
    with pytest.raises(AttributeError):
        dt.name = "FP64"  # type: ignore[misc]
