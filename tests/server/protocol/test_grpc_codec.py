"""Unit tests for server.protocol.grpc_codec: ``ModelInferRequest`` -> ``InferRequest`` and
``InferResponse`` -> ``ModelInferResponse``, and the wire-level fast path (``split_request``,
``encode_response_bytes``) against protobuf's own parsing (triton-facts §0, §2.3, §2.4)."""

from __future__ import annotations

import struct
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from server.errors import InvalidArgument
from server.generated import grpc_service_pb2 as pb
from server.protocol import datatypes
from server.protocol.binary import tensor_to_bytes
from server.protocol.grpc_codec import (
    SPLIT_ABOVE_BYTES,
    decode_request,
    encode_response_bytes,
    encode_response_parts,
    parameter_value,
    split_request,
)
from server.protocol.shared_memory_params import SharedMemoryRef
from server.protocol.types import InferRequest, InferResponse, OutputTensor

DT = datatypes.BY_NAME
RESERVED_TEXT = (
    "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
    "specified."
)

#: A [2, 3] sample per numeric datatype, with the type's extremes.
NUMERIC: dict[str, np.ndarray] = {
    "BOOL": np.array([[True, False, True], [False, False, True]]),
    "UINT8": np.array([[0, 1, 255], [128, 7, 254]], dtype=np.uint8),
    "UINT16": np.array([[0, 1, 65535], [256, 7, 65534]], dtype=np.uint16),
    "UINT32": np.array([[0, 1, 2**32 - 1], [2**16, 7, 2**31]], dtype=np.uint32),
    "UINT64": np.array([[0, 1, 2**64 - 1], [2**32, 7, 2**63]], dtype=np.uint64),
    "INT8": np.array([[-128, -1, 127], [0, 1, 42]], dtype=np.int8),
    "INT16": np.array([[-32768, -1, 32767], [0, 1, 42]], dtype=np.int16),
    "INT32": np.array([[-(2**31), -1, 2**31 - 1], [0, 1, 42]], dtype=np.int32),
    "INT64": np.array([[-(2**63), -1, 2**63 - 1], [0, 1, 42]], dtype=np.int64),
    "FP16": np.array([[65504.0, -0.0, np.inf], [6e-8, -1.5, 1 / 3]], dtype=np.float16),
    "FP32": np.array([[3.4e38, -0.0, -np.inf], [1e-45, -1.5, 1 / 3]], dtype=np.float32),
    "FP64": np.array([[1.7e308, -0.0, np.inf], [5e-324, -1.5, 1 / 3]], dtype=np.float64),
    "BF16": np.array([[3.0e38, -0.0, np.inf], [-1e-38, 1.5, 256.0]], dtype=ml_dtypes.bfloat16),
}
BYTES_SAMPLE = [b"plain", b"", b"\x00\xff", "\u00e9\u2603".encode(), b"", b"x" * 300]

#: Datatype -> the InferTensorContents field that carries it (FP16/BF16 have none).
CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def _length_prefixed(elements: list[bytes]) -> bytes:
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def _request(
    *inputs: pb.ModelInferRequest.InferInputTensor,
    raw: list[bytes] | None = None,
    **fields: Any,
) -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m", model_version="", **fields)
    msg.inputs.extend(inputs)
    if raw is not None:
        msg.raw_input_contents.extend(raw)
    return msg


def _input(
    name: str, datatype: str, shape: list[int], contents: dict[str, Any] | None = None
) -> pb.ModelInferRequest.InferInputTensor:
    tensor = pb.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)
    if contents is not None:
        for field, values in contents.items():
            getattr(tensor.contents, field).extend(values)
    return tensor


def _fp32_raw_request(**fields: Any) -> pb.ModelInferRequest:
    return _request(
        _input("IN", "FP32", [1, 2]), raw=[np.ones(2, np.float32).tobytes()], **fields
    )


def _set_param(params: Any, key: str, kind: str, value: Any) -> None:
    setattr(params[key], kind, value)


def _assert_same(got: np.ndarray, expected: np.ndarray) -> None:
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()


# --- raw_input_contents ----------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(NUMERIC))
def test_raw_input_every_numeric_datatype(name: str) -> None:
    values = NUMERIC[name]
    request = decode_request(_request(_input("IN", name, [2, 3]), raw=[values.tobytes()]))
    assert len(request.inputs) == 1
    tensor = request.inputs[0]
    assert (tensor.name, tensor.datatype, tensor.shape) == ("IN", DT[name], (2, 3))
    _assert_same(tensor.data, values)


def test_raw_input_bytes_length_prefixed_with_empty_and_binary_elements() -> None:
    raw = _length_prefixed(BYTES_SAMPLE)
    request = decode_request(_request(_input("IN", "BYTES", [2, 3]), raw=[raw]))
    data = request.inputs[0].data
    assert data.dtype == object and data.shape == (2, 3)
    assert list(data.reshape(-1)) == BYTES_SAMPLE
    assert all(type(item) is bytes for item in data.reshape(-1))


def test_raw_input_bytes_all_empty_elements() -> None:
    raw = _length_prefixed([b"", b"", b""])
    request = decode_request(_request(_input("IN", "BYTES", [1, 3]), raw=[raw]))
    assert list(request.inputs[0].data.reshape(-1)) == [b"", b"", b""]


@pytest.mark.parametrize(
    "elements, shape",
    [
        ([b"a", b"b"], [1, 3]),  # too few elements
        ([b"a", b"b", b"c", b"d"], [1, 3]),  # too many
    ],
)
def test_raw_input_bytes_wrong_element_count_refused(
    elements: list[bytes], shape: list[int]
) -> None:
    raw = _length_prefixed(elements)
    with pytest.raises(InvalidArgument, match="string elements"):
        decode_request(_request(_input("IN", "BYTES", shape), raw=[raw]))


def test_raw_input_bytes_truncated_element_refused() -> None:
    raw = _length_prefixed([b"abc"])[:-1]
    with pytest.raises(InvalidArgument, match="IN"):
        decode_request(_request(_input("IN", "BYTES", [1, 1]), raw=[raw]))


def test_raw_input_byte_size_mismatch_refused_with_tritons_text() -> None:
    raw = np.ones(10, np.float32).tobytes()
    with pytest.raises(InvalidArgument) as info:
        decode_request(_request(_input("INPUT0", "FP32", [1, 8]), raw=[raw]))
    assert info.value.message == (
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'm'. "
        "Expected 32, got 40"
    )


def test_raw_inputs_are_matched_to_inputs_in_order() -> None:
    a = np.arange(4, dtype=np.int32)
    b = np.arange(3, dtype=np.float64)
    request = decode_request(
        _request(_input("A", "INT32", [1, 4]), _input("B", "FP64", [1, 3]), raw=[a.tobytes(), b.tobytes()])
    )
    assert [t.name for t in request.inputs] == ["A", "B"]
    _assert_same(request.inputs[0].data, a.reshape(1, 4))
    _assert_same(request.inputs[1].data, b.reshape(1, 3))


@pytest.mark.parametrize("raw_count", [1, 3])
def test_raw_count_different_from_inputs_refused(raw_count: int) -> None:
    blob = np.ones(2, np.float32).tobytes()
    msg = _request(
        _input("A", "FP32", [1, 2]), _input("B", "FP32", [1, 2]), raw=[blob] * raw_count
    )
    with pytest.raises(InvalidArgument, match="raw input contents"):
        decode_request(msg)


def test_mixing_raw_and_typed_contents_refused() -> None:
    blob = np.ones(2, np.float32).tobytes()
    typed = _input("B", "FP32", [1, 2], {"fp32_contents": [1.0, 2.0]})
    with pytest.raises(InvalidArgument) as caught:
        decode_request(_request(_input("A", "FP32", [1, 2]), typed, raw=[blob, blob]))
    # Triton's text, naming the tensor (NVIDIA's grpc_explicit_int_content_client.py matches it)
    assert caught.value.message == (
        "contents field must not be specified when using raw_input_contents for 'B' for model "
        "'m'"
    )
    # also when the typed input is the only one
    with pytest.raises(InvalidArgument, match="raw_input_contents for 'B' for model"):
        decode_request(_request(typed, raw=[blob]))


def test_negative_dims_refused() -> None:
    with pytest.raises(InvalidArgument, match="shape"):
        decode_request(_request(_input("IN", "FP32", [-1, 2]), raw=[b"\x00" * 8]))


def test_unknown_datatype_refused() -> None:
    with pytest.raises(InvalidArgument, match="invalid datatype 'FLOAT32'"):
        decode_request(_request(_input("IN", "FLOAT32", [1]), raw=[b"\x00" * 4]))


def test_raw_bool_other_than_0_or_1_refused() -> None:
    with pytest.raises(InvalidArgument, match="BOOL"):
        decode_request(_request(_input("IN", "BOOL", [1, 2]), raw=[b"\x01\x02"]))


# --- typed contents --------------------------------------------------------------------------


def _typed_sample(name: str) -> tuple[list[Any], np.ndarray]:
    """(values for the contents field, the array they must decode to) for a [2, 3] tensor."""
    if name == "BYTES":
        expected = np.empty(6, dtype=object)
        expected[:] = BYTES_SAMPLE
        return list(BYTES_SAMPLE), expected.reshape(2, 3)
    if name == "FP32":
        # values that survive the float wire type exactly
        array = np.array([[3.4e38, -0.0, -np.inf], [1e-45, -1.5, 0.25]], dtype=np.float32)
        return [float(v) for v in array.reshape(-1)], array
    array = NUMERIC[name]
    return array.reshape(-1).tolist(), array


@pytest.mark.parametrize("name", sorted(CONTENTS_FIELD))
def test_typed_contents_every_datatype(name: str) -> None:
    values, expected = _typed_sample(name)
    field = CONTENTS_FIELD[name]
    request = decode_request(_request(_input("IN", name, [2, 3], {field: values})))
    tensor = request.inputs[0]
    assert (tensor.name, tensor.datatype, tensor.shape) == ("IN", DT[name], (2, 3))
    if name == "BYTES":
        assert tensor.data.dtype == object and tensor.data.shape == (2, 3)
        assert list(tensor.data.reshape(-1)) == BYTES_SAMPLE
    else:
        _assert_same(tensor.data, expected)


def test_typed_contents_of_several_inputs() -> None:
    request = decode_request(
        _request(
            _input("A", "INT32", [1, 3], {"int_contents": [1, 2, 3]}),
            _input("B", "BYTES", [1, 2], {"bytes_contents": [b"", b"\x00\xff"]}),
        )
    )
    _assert_same(request.inputs[0].data, np.array([[1, 2, 3]], dtype=np.int32))
    assert list(request.inputs[1].data.reshape(-1)) == [b"", b"\x00\xff"]


@pytest.mark.parametrize(
    "name, field, bad",
    [
        ("INT8", "int_contents", 128),
        ("INT8", "int_contents", -129),
        ("INT16", "int_contents", 32768),
        ("INT16", "int_contents", -32769),
        ("UINT8", "uint_contents", 256),
        ("UINT16", "uint_contents", 65536),
    ],
)
def test_narrow_integer_contents_out_of_range_refused(name: str, field: str, bad: int) -> None:
    with pytest.raises(InvalidArgument, match=f"out of range for {name}"):
        decode_request(_request(_input("IN", name, [1, 2], {field: [0, bad]})))


@pytest.mark.parametrize(
    "name, field, edge",
    [
        ("INT8", "int_contents", [-128, 127]),
        ("INT16", "int_contents", [-32768, 32767]),
        ("INT32", "int_contents", [-(2**31), 2**31 - 1]),
        ("UINT8", "uint_contents", [0, 255]),
        ("UINT16", "uint_contents", [0, 65535]),
        ("UINT32", "uint_contents", [0, 2**32 - 1]),
        ("UINT64", "uint64_contents", [0, 2**64 - 1]),
        ("INT64", "int64_contents", [-(2**63), 2**63 - 1]),
    ],
)
def test_integer_contents_range_edges_accepted(name: str, field: str, edge: list[int]) -> None:
    request = decode_request(_request(_input("IN", name, [1, 2], {field: edge})))
    data = request.inputs[0].data
    assert data.dtype == DT[name].dtype
    assert data.reshape(-1).tolist() == edge


@pytest.mark.parametrize("name", ["FP16", "BF16"])
def test_fp16_and_bf16_via_contents_refused(name: str) -> None:
    for field in ("fp32_contents", "fp64_contents"):
        with pytest.raises(InvalidArgument, match="raw_input_contents"):
            decode_request(_request(_input("IN", name, [1, 2], {field: [1.0, 2.0]})))
    # with no contents at all too: there is no field that could carry it
    with pytest.raises(InvalidArgument, match="raw_input_contents"):
        decode_request(_request(_input("IN", name, [1, 2])))


@pytest.mark.parametrize(
    "name, wrong_field, values",
    [
        ("INT32", "fp32_contents", [1.0, 2.0]),
        ("INT32", "uint_contents", [1, 2]),
        ("INT32", "int64_contents", [1, 2]),
        ("FP32", "fp64_contents", [1.0, 2.0]),
        ("FP64", "fp32_contents", [1.0, 2.0]),
        ("UINT8", "int_contents", [1, 2]),
        ("UINT64", "int64_contents", [1, 2]),
        ("BOOL", "int_contents", [1, 0]),
        ("BYTES", "int_contents", [1, 2]),
        ("INT64", "bytes_contents", [b"a", b"b"]),
    ],
)
def test_wrong_contents_field_refused(name: str, wrong_field: str, values: list[Any]) -> None:
    with pytest.raises(InvalidArgument) as info:
        decode_request(_request(_input("IN", name, [1, 2], {wrong_field: values})))
    assert wrong_field in info.value.message
    assert CONTENTS_FIELD[name] in info.value.message


def test_wrong_contents_field_beside_the_right_one_refused() -> None:
    contents = {"fp32_contents": [1.0, 2.0], "fp64_contents": [1.0, 2.0]}
    with pytest.raises(InvalidArgument, match="fp64_contents"):
        decode_request(_request(_input("IN", "FP32", [1, 2], contents)))


@pytest.mark.parametrize("count", [0, 5, 7])
@pytest.mark.parametrize("name", ["INT32", "FP64", "BYTES", "BOOL"])
def test_typed_element_count_mismatch_refused(name: str, count: int) -> None:
    field = CONTENTS_FIELD[name]
    value: Any = {"INT32": 1, "FP64": 1.0, "BYTES": b"x", "BOOL": True}[name]
    with pytest.raises(InvalidArgument) as info:
        decode_request(_request(_input("IN", name, [2, 3], {field: [value] * count})))
    assert info.value.message == (
        f"expected 6 elements in '{field}' of input 'IN' for model 'm', got {count}"
    )


def test_typed_contents_empty_tensor() -> None:
    request = decode_request(_request(_input("IN", "FP32", [1, 0])))
    assert request.inputs[0].data.shape == (1, 0)
    assert request.inputs[0].data.dtype == np.float32


# --- parameters ------------------------------------------------------------------------------


def test_parameter_value_of_every_kind() -> None:
    kinds: dict[str, Any] = {
        "bool_param": True,
        "int64_param": -(2**63),
        "string_param": "s\u00e9",
        "double_param": 0.5,
        "uint64_param": 2**64 - 1,
    }
    for kind, value in kinds.items():
        param = pb.InferParameter(**{kind: value})
        got = parameter_value(param)
        assert got == value and type(got) is type(value)
    assert parameter_value(pb.InferParameter()) is None


def test_request_input_and_output_parameters_of_every_kind_decoded() -> None:
    msg = _fp32_raw_request()
    kinds = [
        ("b", "bool_param", False),
        ("i", "int64_param", -7),
        ("s", "string_param", "text"),
        ("d", "double_param", 2.5),
        ("u", "uint64_param", 2**64 - 1),
    ]
    output = msg.outputs.add(name="OUT")
    for key, kind, value in kinds:
        _set_param(msg.parameters, key, kind, value)
        _set_param(msg.inputs[0].parameters, key, kind, value)
        _set_param(output.parameters, key, kind, value)
    request = decode_request(msg)
    expected = {key: value for key, _, value in kinds}
    for params in (request.parameters, request.inputs[0].parameters):
        assert params == expected
        assert {k: type(v) for k, v in params.items()} == {k: type(v) for k, v in expected.items()}
    assert request.outputs is not None
    assert request.outputs[0].parameters == expected


def test_parameter_without_a_value_refused() -> None:
    msg = _fp32_raw_request()
    msg.parameters["empty"].CopyFrom(pb.InferParameter())
    with pytest.raises(InvalidArgument, match="'empty'"):
        decode_request(msg)


def test_enable_empty_final_response_accepted() -> None:
    msg = _fp32_raw_request()
    msg.parameters["triton_enable_empty_final_response"].bool_param = True
    request = decode_request(msg)
    assert request.parameters["triton_enable_empty_final_response"] is True


@pytest.mark.parametrize(
    "key", ["triton_final_response", "triton_", "triton_other", "triton_enable_empty"]
)
def test_other_reserved_triton_keys_refused(key: str) -> None:
    msg = _fp32_raw_request()
    msg.parameters[key].bool_param = True
    with pytest.raises(InvalidArgument) as info:
        decode_request(msg)
    assert info.value.message == RESERVED_TEXT


def test_triton_prefix_is_case_sensitive_and_only_a_prefix() -> None:
    msg = _fp32_raw_request()
    msg.parameters["Triton_x"].bool_param = True
    msg.parameters["my_triton_x"].bool_param = True
    assert set(decode_request(msg).parameters) == {"Triton_x", "my_triton_x"}


@pytest.mark.parametrize(
    "kind, value", [("int64_param", 0), ("int64_param", 5), ("uint64_param", 5), ("uint64_param", 2**64 - 1)]
)
def test_priority_as_int64_or_uint64_accepted(kind: str, value: int) -> None:
    msg = _fp32_raw_request()
    _set_param(msg.parameters, "priority", kind, value)
    assert decode_request(msg).parameters["priority"] == value


@pytest.mark.parametrize(
    "kind, value",
    [
        ("int64_param", -1),
        ("string_param", "1"),
        ("double_param", 1.0),
        ("bool_param", True),
    ],
)
def test_priority_negative_or_not_an_integer_refused(kind: str, value: Any) -> None:
    msg = _fp32_raw_request()
    _set_param(msg.parameters, "priority", kind, value)
    with pytest.raises(InvalidArgument, match="priority"):
        decode_request(msg)


def test_timeout_as_int64_accepted() -> None:
    msg = _fp32_raw_request()
    msg.parameters["timeout"].int64_param = 1000
    assert decode_request(msg).parameters["timeout"] == 1000


@pytest.mark.parametrize(
    "kind, value",
    [
        ("uint64_param", 1000),
        ("string_param", "1000"),
        ("double_param", 1000.0),
        ("bool_param", True),
        ("int64_param", -1),
    ],
)
def test_timeout_other_than_non_negative_int64_refused(kind: str, value: Any) -> None:
    msg = _fp32_raw_request()
    _set_param(msg.parameters, "timeout", kind, value)
    with pytest.raises(InvalidArgument, match="timeout"):
        decode_request(msg)


@pytest.mark.parametrize("count", [0, 1, 3])
def test_an_output_class_count_is_kept(count: int) -> None:
    msg = _fp32_raw_request()
    msg.outputs.add(name="OUT").parameters["classification"].int64_param = count
    request = decode_request(msg)
    assert request.outputs is not None
    assert request.outputs[0].parameters == {"classification": count}


_NEGATIVE = (  # the HTTP text: both transports say the same
    "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
    "unsigned-integer"
)
_WRONG_KIND = "invalid value type for 'classification' parameter, expected int64_param"


@pytest.mark.parametrize(
    ("kind", "value", "message"),
    [
        ("int64_param", -1, _NEGATIVE),
        ("string_param", "3", _WRONG_KIND),
        ("uint64_param", 3, _WRONG_KIND),
        ("bool_param", True, _WRONG_KIND),
        ("double_param", 3.0, _WRONG_KIND),
    ],
)
def test_a_wrong_class_count_is_refused(kind: str, value: Any, message: str) -> None:
    msg = _fp32_raw_request()
    _set_param(msg.outputs.add(name="OUT").parameters, "classification", kind, value)
    with pytest.raises(InvalidArgument) as err:
        decode_request(msg)
    assert err.value.message == message
    assert err.value.grpc_status_name == "INVALID_ARGUMENT"


def test_a_class_count_on_an_output_in_shared_memory_is_refused() -> None:
    msg = _fp32_raw_request()
    params = msg.outputs.add(name="OUT").parameters
    params["shared_memory_region"].string_param = "o"
    params["shared_memory_byte_size"].int64_param = 64
    params["classification"].int64_param = 2
    with pytest.raises(
        InvalidArgument, match="^Output can't set both 'shared_memory_region' and 'classification'$"
    ):
        decode_request(msg)


def test_shared_memory_inputs_take_no_raw_entry_and_outputs_carry_their_region() -> None:
    """An input in shared memory has no raw_input_contents entry (the others keep theirs, in
    order); the data plane reads it from the region later."""
    msg = pb.ModelInferRequest(model_name="m")
    for name in ("A", "B", "C"):
        msg.inputs.add(name=name, datatype="FP32", shape=[2])
    params = msg.inputs[1].parameters
    params["shared_memory_region"].string_param = "r"
    params["shared_memory_offset"].int64_param = 16
    params["shared_memory_byte_size"].int64_param = 8
    msg.raw_input_contents.extend(
        [np.array([1, 2], np.float32).tobytes(), np.array([5, 6], np.float32).tobytes()]
    )
    out = msg.outputs.add(name="OUT").parameters
    out["shared_memory_region"].string_param = "o"
    out["shared_memory_byte_size"].int64_param = 64
    request = decode_request(msg)
    a, b, c = request.inputs
    np.testing.assert_array_equal(a.data, [1, 2])
    np.testing.assert_array_equal(c.data, [5, 6])
    assert b.shared_memory == SharedMemoryRef("r", 16, 8)
    assert a.shared_memory is None and c.shared_memory is None
    assert request.outputs is not None
    assert request.outputs[0].shared_memory == SharedMemoryRef("o", 0, 64)


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"shared_memory_region": ""}, "must be a non-empty string"),
        ({"shared_memory_region": "r"}, "'shared_memory_byte_size' is required"),
        ({"shared_memory_region": "r", "shared_memory_byte_size": -1}, "non-negative"),
        ({"shared_memory_byte_size": 4}, "must be a non-empty string"),
    ],
)
def test_malformed_shared_memory_parameters(params: dict[str, object], message: str) -> None:
    msg = _fp32_raw_request()
    msg.raw_input_contents.pop()
    for key, value in params.items():
        if isinstance(value, str):
            msg.inputs[0].parameters[key].string_param = value
        else:
            msg.inputs[0].parameters[key].int64_param = value  # type: ignore[assignment]
    with pytest.raises(InvalidArgument, match=message):
        decode_request(msg)


# --- request fields --------------------------------------------------------------------------


def test_no_outputs_means_all_outputs() -> None:
    request = decode_request(_fp32_raw_request())
    assert request.outputs is None


def test_requested_outputs_in_order() -> None:
    msg = _fp32_raw_request()
    for name in ("B", "A", "C"):
        msg.outputs.add(name=name)
    request = decode_request(msg)
    assert request.outputs is not None
    assert [o.name for o in request.outputs] == ["B", "A", "C"]


def test_model_version_and_id() -> None:
    msg = _fp32_raw_request(id="req-7")
    msg.model_name = "identity"
    msg.model_version = "3"
    request = decode_request(msg)
    assert (request.model_name, request.model_version, request.id) == ("identity", "3", "req-7")
    assert decode_request(_fp32_raw_request()).id is None


# --- encode_response -------------------------------------------------------------------------


def encode_response(response: InferResponse, final_flag: bool = False) -> pb.ModelInferResponse:
    """What the server sends, parsed back by protobuf (flagged final: a stream's reply)."""
    if not final_flag:
        return pb.ModelInferResponse.FromString(encode_response_bytes(response))
    reply = pb.ModelStreamInferResponse.FromString(encode_response_bytes(response, stream=True))
    assert reply.error_message == ""
    return reply.infer_response


def _expected_message(response: InferResponse, final_flag: bool) -> pb.ModelInferResponse:
    """The same response built the plain protobuf way, to check the hand-written encoding."""
    msg = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id or ""
    )
    for output in response.outputs:
        msg.outputs.add(name=output.name, datatype=output.datatype.name, shape=output.shape)
        msg.raw_output_contents.append(bytes(tensor_to_bytes(output.data, output.datatype)))
    if final_flag:
        msg.parameters["triton_final_response"].bool_param = True
    return msg


def _output(name: str, datatype: str, data: np.ndarray) -> OutputTensor:
    return OutputTensor(name, DT[datatype], tuple(data.shape), data)


def _response(*outputs: OutputTensor, id: str | None = None) -> InferResponse:
    return InferResponse(model_name="m", model_version="2", outputs=list(outputs), id=id)


def test_raw_output_contents_one_per_output_in_order() -> None:
    bytes_out = np.empty(6, dtype=object)
    bytes_out[:] = BYTES_SAMPLE
    outputs = [_output(name, name, NUMERIC[name]) for name in sorted(NUMERIC)]
    outputs.insert(3, _output("BYTES", "BYTES", bytes_out.reshape(2, 3)))
    msg = encode_response(_response(*outputs))
    assert (msg.model_name, msg.model_version) == ("m", "2")
    assert len(msg.outputs) == len(outputs) == len(msg.raw_output_contents)
    for wire, output, raw in zip(msg.outputs, outputs, msg.raw_output_contents):
        assert (wire.name, wire.datatype, list(wire.shape)) == (
            output.name,
            output.datatype.name,
            [2, 3],
        )
        assert not wire.HasField("contents")
        if output.datatype.is_bytes:
            assert raw == _length_prefixed(BYTES_SAMPLE)
        else:
            assert raw == NUMERIC[output.name].tobytes()


def test_raw_output_is_little_endian_and_row_major() -> None:
    big = np.arange(6, dtype=">i4").reshape(2, 3)
    transposed = np.arange(6, dtype=np.float32).reshape(3, 2).T  # not C-contiguous
    msg = encode_response(_response(_output("A", "INT32", big), _output("B", "FP32", transposed)))
    assert msg.raw_output_contents[0] == np.arange(6, dtype="<i4").tobytes()
    assert msg.raw_output_contents[1] == np.ascontiguousarray(transposed).tobytes()


def test_empty_output_still_has_a_raw_entry() -> None:
    msg = encode_response(
        _response(
            _output("A", "FP32", np.zeros((1, 0), np.float32)),
            _output("B", "INT8", np.array([[5]], np.int8)),
        )
    )
    assert list(msg.raw_output_contents) == [b"", b"\x05"]
    assert list(msg.outputs[0].shape) == [1, 0]


def test_final_response_flag_only_when_asked() -> None:
    out = _output("A", "INT32", np.ones((1, 1), np.int32))
    assert "triton_final_response" not in encode_response(_response(out)).parameters
    assert "triton_final_response" not in encode_response(_response(out), False).parameters
    flagged = encode_response(_response(out), final_flag=True)
    param = flagged.parameters["triton_final_response"]
    assert param.WhichOneof("parameter_choice") == "bool_param" and param.bool_param is True


def test_response_id_echoed() -> None:
    out = _output("A", "INT32", np.ones((1, 1), np.int32))
    assert encode_response(_response(out, id="abc")).id == "abc"
    assert encode_response(_response(out)).id == ""


def test_decode_then_encode_round_trip_for_every_raw_datatype() -> None:
    """What the codec reads from raw contents it writes back byte-identical."""
    msg = pb.ModelInferRequest(model_name="m")
    for name, values in NUMERIC.items():
        msg.inputs.add(name=name, datatype=name, shape=[2, 3])
        msg.raw_input_contents.append(values.tobytes())
    msg.inputs.add(name="BYTES", datatype="BYTES", shape=[2, 3])
    msg.raw_input_contents.append(_length_prefixed(BYTES_SAMPLE))
    request: InferRequest = decode_request(msg)
    response = _response(
        *(OutputTensor(t.name, t.datatype, t.shape, t.data) for t in request.inputs)
    )
    encoded = encode_response(response)
    assert list(encoded.raw_output_contents) == list(msg.raw_input_contents)


# --- wire-level request split and response encoding ------------------------------------------


def _key(field: int, wire_type: int) -> bytes:
    return _varint(field << 3 | wire_type)


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        out.append(byte | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _length_delimited(field: int, payload: bytes) -> bytes:
    return _key(field, 2) + _varint(len(payload)) + payload


def _rich_request() -> pb.ModelInferRequest:
    msg = pb.ModelInferRequest(model_name="m", model_version="3", id="rich")
    msg.parameters["priority"].uint64_param = 2
    msg.parameters["s"].string_param = "x" * 200
    msg.inputs.add(name="A", datatype="FP32", shape=[1, 4])
    msg.inputs.add(name="B", datatype="BYTES", shape=[1, 3])
    msg.inputs.add(name="C", datatype="UINT8", shape=[1, 0])
    msg.inputs.add(name="D", datatype="INT8", shape=[1, 20000])
    msg.outputs.add(name="OUT").parameters["binary_data"].bool_param = True
    msg.raw_input_contents.extend(
        [
            np.arange(4, dtype=np.float32).tobytes(),
            _length_prefixed([b"", b"\x00\xff", b"abc"]),
            b"",  # an empty entry still counts
            bytes(range(256)) * 78 + bytes(32),  # 20000 bytes: a 3-byte length varint
        ]
    )
    return msg


def _without_raw(msg: pb.ModelInferRequest) -> pb.ModelInferRequest:
    copy = pb.ModelInferRequest()
    copy.CopyFrom(msg)
    copy.ClearField("raw_input_contents")
    return copy


def test_split_request_separates_raw_contents_in_order() -> None:
    msg = _rich_request()
    header, raw = split_request(msg.SerializeToString(), False)
    assert raw is not None  # not whole_if_small: always the views
    assert header == _without_raw(msg)
    assert [bytes(r) for r in raw] == list(msg.raw_input_contents)


def test_split_request_of_a_message_without_raw_contents() -> None:
    msg = pb.ModelInferRequest(model_name="m")
    msg.inputs.add(name="A", datatype="INT32", shape=[2]).contents.int_contents.extend([1, 2])
    header, raw = split_request(msg.SerializeToString(), False)
    assert header == msg and raw == []
    assert split_request(b"", False) == (pb.ModelInferRequest(), [])


def test_split_request_accepts_fields_in_any_order_and_interleaved() -> None:
    """Protobuf allows fields in any order (and repeated fields split up): raw contents
    before the inputs, between them, and scalar fields repeated (the last one wins)."""
    a, b = b"\x01\x00\x00\x00", b"\x02\x00\x00\x00\x03\x00\x00\x00"
    input_a = pb.ModelInferRequest.InferInputTensor(name="A", datatype="INT32", shape=[1, 1])
    input_b = pb.ModelInferRequest.InferInputTensor(name="B", datatype="INT32", shape=[1, 2])
    data = b"".join(
        [
            _length_delimited(7, a),
            _length_delimited(1, b"first-name"),
            _length_delimited(5, input_a.SerializeToString()),
            _length_delimited(7, b),
            _length_delimited(5, input_b.SerializeToString()),
            _length_delimited(1, b"m"),
        ]
    )
    header, raw = split_request(data, False)
    assert raw is not None  # not whole_if_small: always the views
    assert header.model_name == "m"
    assert [t.name for t in header.inputs] == ["A", "B"]
    assert [bytes(r) for r in raw] == [a, b]
    request = decode_request(header, None, raw)
    assert [t.data.tolist() for t in request.inputs] == [[[1]], [[2, 3]]]


def test_split_request_skips_unknown_fields_of_every_wire_type() -> None:
    msg = _rich_request()
    unknown = b"".join(
        [
            _key(100, 0) + _varint(2**63),
            _key(101, 1) + bytes(8),
            _key(102, 5) + bytes(4),
            _length_delimited(103, b"ignored payload"),
        ]
    )
    header, raw = split_request(unknown + msg.SerializeToString() + unknown, False)
    assert raw is not None  # not whole_if_small: always the views
    header.DiscardUnknownFields()
    assert header == _without_raw(msg)
    assert [bytes(r) for r in raw] == list(msg.raw_input_contents)


@pytest.mark.parametrize(
    "data",
    [
        _key(7, 2) + _varint(10) + b"short",  # raw entry longer than the message
        _key(1, 2) + _varint(10) + b"short",  # another field truncated
        _key(100, 1) + bytes(3),  # truncated fixed64
        _key(100, 5) + bytes(2),  # truncated fixed32
        _key(100, 0) + b"\xff\xff",  # varint never ends
        b"\xff" * 11,  # key varint too long
        _key(100, 3),  # group wire types
        _key(100, 6),
        _key(100, 7),
        _length_delimited(5, b"\xff\xff\xff"),  # a malformed nested message
    ],
)
@pytest.mark.parametrize("whole_if_small", [False, True])
def test_split_request_malformed_is_invalid_argument(data: bytes, whole_if_small: bool) -> None:
    with pytest.raises(InvalidArgument, match="malformed ModelInferRequest"):
        split_request(data, whole_if_small)


def test_split_then_decode_equals_decode_of_the_parsed_message() -> None:
    msg = pb.ModelInferRequest(model_name="m", id="x")
    for name, values in NUMERIC.items():
        msg.inputs.add(name=name, datatype=name, shape=[2, 3])
        msg.raw_input_contents.append(values.tobytes())
    msg.inputs.add(name="BYTES", datatype="BYTES", shape=[2, 3])
    msg.raw_input_contents.append(_length_prefixed(BYTES_SAMPLE))
    header, raw = split_request(msg.SerializeToString(), False)
    split = decode_request(header, None, raw)
    whole = decode_request(msg)
    assert [t.name for t in split.inputs] == [t.name for t in whole.inputs]
    for got, expected in zip(split.inputs, whole.inputs, strict=True):
        if expected.datatype.is_bytes:
            assert got.data.tolist() == expected.data.tolist()
        else:
            _assert_same(got.data, expected.data)
    assert split.id == whole.id == "x"


def test_split_raw_count_checks_still_apply() -> None:
    msg = _fp32_raw_request()
    msg.raw_input_contents.append(b"extra")
    header, raw = split_request(msg.SerializeToString())
    with pytest.raises(InvalidArgument, match="raw input contents"):
        decode_request(header, None, raw)
    msg = _fp32_raw_request()
    msg.inputs[0].contents.fp32_contents.extend([1.0, 2.0])
    header, raw = split_request(msg.SerializeToString())
    with pytest.raises(InvalidArgument, match="contents field must not be specified"):
        decode_request(header, None, raw)


def _all_outputs() -> list[OutputTensor]:
    bytes_out = np.empty(6, dtype=object)
    bytes_out[:] = BYTES_SAMPLE
    outputs = [_output(name, name, NUMERIC[name]) for name in sorted(NUMERIC)]
    outputs.append(_output("BYTES", "BYTES", bytes_out.reshape(2, 3)))
    outputs.append(_output("EMPTY", "FP32", np.zeros((1, 0), np.float32)))
    outputs.append(_output("BIG", "FP64", np.arange(3000, dtype=np.float64).reshape(1, 3000)))
    outputs.append(_output("BE", "INT32", np.arange(6, dtype=">i4").reshape(2, 3)))
    outputs.append(_output("T", "FP32", np.arange(6, dtype=np.float32).reshape(3, 2).T))
    return outputs


def test_encode_response_bytes_is_the_serialized_response() -> None:
    response = _response(*_all_outputs(), id="r1")
    wire = encode_response_bytes(response)
    parsed = pb.ModelInferResponse.FromString(wire)
    assert parsed == _expected_message(response, False)
    assert len(parsed.raw_output_contents) == len(response.outputs)
    assert parsed.raw_output_contents[-2] == np.arange(6, dtype="<i4").tobytes()


def test_encode_response_bytes_without_outputs_or_id() -> None:
    response = _response()
    parsed = pb.ModelInferResponse.FromString(encode_response_bytes(response))
    assert parsed == pb.ModelInferResponse(model_name="m", model_version="2")


def test_responses_without_id_share_headers_only_when_they_hold_the_same() -> None:
    """Headers of responses without an id or parameters are kept and reused: each is still
    the serialized response, and one with other names, shapes or version is its own."""
    first = _response(*_all_outputs())
    assert pb.ModelInferResponse.FromString(encode_response_bytes(first)) == _expected_message(
        first, False
    )
    again = _response(*_all_outputs())
    assert encode_response_bytes(again) == encode_response_bytes(first)
    reshaped = _response(_output("OUT", "FP32", np.zeros((2, 3), np.float32)))
    other = _response(_output("OUT", "FP32", np.zeros((3, 2), np.float32)))
    for response in (reshaped, other):
        parsed = pb.ModelInferResponse.FromString(encode_response_bytes(response))
        assert parsed == _expected_message(response, False)
    renamed = _response(_output("OUT2", "FP32", np.zeros((2, 3), np.float32)))
    assert pb.ModelInferResponse.FromString(encode_response_bytes(renamed)).outputs[0].name == (
        "OUT2"
    )
    version_3 = InferResponse("m", "3", [_output("OUT", "FP32", np.zeros((2, 3), np.float32))])
    assert pb.ModelInferResponse.FromString(encode_response_bytes(version_3)).model_version == "3"
    with_parameter = _response(_output("OUT", "FP32", np.zeros((2, 3), np.float32)))
    with_parameter.parameters["sequence_id"] = 7
    parsed = pb.ModelInferResponse.FromString(encode_response_bytes(with_parameter))
    assert parsed.parameters["sequence_id"].int64_param == 7


def test_stream_reply_wraps_the_final_response() -> None:
    response = _response(*_all_outputs(), id="s1")
    wire = encode_response_bytes(response, stream=True)
    parsed = pb.ModelStreamInferResponse.FromString(wire)
    assert parsed.error_message == ""
    assert parsed.infer_response == _expected_message(response, True)


@pytest.mark.parametrize("stream", [False, True])
def test_response_parts_view_the_outputs_and_join_into_the_message(stream: bool) -> None:
    """The parts a reply is written from: each contiguous little-endian output as a view of
    its array (no copy), together the serialized message."""
    big = np.arange(3000, dtype=np.float64).reshape(1, 3000)
    response = _response(_output("BIG", "FP64", big), *_all_outputs(), id="p")
    parts = encode_response_parts(response, stream=stream)
    assert any(isinstance(p, memoryview) and np.shares_memory(np.asarray(p), big) for p in parts)
    assert b"".join(parts) == encode_response_bytes(response, stream=stream)


def test_a_small_request_is_parsed_whole_and_a_large_one_split() -> None:
    """Below SPLIT_ABOVE_BYTES protobuf parses the message with its contents (None for the
    views); above it the contents are views of the received bytes. Both decode the same."""
    small = _rich_request()
    data = small.SerializeToString()
    assert len(data) <= SPLIT_ABOVE_BYTES
    header, raw = split_request(data)
    assert header == small and raw is None
    assert [t.data.tolist() for t in decode_request(header, None, raw).inputs] == [
        t.data.tolist() for t in decode_request(small).inputs
    ]
    large = pb.ModelInferRequest(model_name="m")
    large.inputs.add(name="A", datatype="UINT8", shape=[SPLIT_ABOVE_BYTES + 1])
    large.raw_input_contents.append(bytes(SPLIT_ABOVE_BYTES + 1))
    data = large.SerializeToString()
    header, raw = split_request(data)
    assert raw is not None and [r.obj for r in raw] == [data]
    assert decode_request(header, None, raw).inputs[0].data.nbytes == SPLIT_ABOVE_BYTES + 1
