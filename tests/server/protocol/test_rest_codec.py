"""Unit tests for server.protocol.rest_codec: V2 REST JSON header + binary data, both ways."""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pytest
from google.protobuf import text_format

from server.errors import InvalidArgument
from server.generated import model_config_pb2 as mc
from server.protocol import datatypes
from server.protocol.model_spec import ModelSpec
from server.protocol.rest_codec import (
    EncodedResponse,
    decode_raw_request,
    decode_request,
    encode_response,
    encoding_cost,
    parse_json,
)
from server.protocol.types import InferRequest, InferResponse, OutputTensor, RequestedOutput

DT = datatypes.BY_NAME
EMPTY = memoryview(b"")


def _json_input(
    name: str = "INPUT0", datatype: str = "INT32", shape: Any = None, data: Any = None
) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": [1, 4] if shape is None else shape,
        "data": [1, 2, 3, 4] if data is None else data,
    }


def _binary_input(name: str, datatype: str, shape: list[int], size: int) -> dict[str, Any]:
    return {
        "name": name,
        "datatype": datatype,
        "shape": shape,
        "parameters": {"binary_data_size": size},
    }


def _decode(header: Any, binary: bytes | bytearray = b"") -> InferRequest:
    return decode_request(header, memoryview(binary), "m", "1")


def _invalid(header: Any, binary: bytes = b"") -> str:
    with pytest.raises(InvalidArgument) as err:
        _decode(header, binary)
    assert err.value.http_status == 400
    return str(err.value)


# ---- parse_json --------------------------------------------------------------------------


def test_parse_json_ok() -> None:
    assert parse_json(b'{"a": [1, 2]}') == {"a": [1, 2]}
    assert parse_json(memoryview(b'{"a": 1}')) == {"a": 1}


@pytest.mark.parametrize("text", [b"{", b"", b"{'a': 1}", b"[1,]", b"\xff"])
def test_parse_json_error_names_what(text: bytes) -> None:
    with pytest.raises(InvalidArgument, match="^failed to parse the request JSON: "):
        parse_json(text)
    with pytest.raises(InvalidArgument, match="^failed to parse the config JSON: "):
        parse_json(text, "config")


# ---- decode_request: JSON inputs ---------------------------------------------------------


def test_decode_json_inputs() -> None:
    header = {
        "inputs": [
            _json_input("INPUT0", "INT32", [1, 4], [[1, 2, 3, 4]]),
            _json_input("INPUT1", "FP32", [2], [0.5, 1.5]),
            _json_input("INPUT2", "BYTES", [1], ["hi"]),
            _json_input("INPUT3", "BOOL", [2], [True, False]),
        ]
    }
    request = _decode(header)
    assert request.model_name == "m" and request.model_version == "1"
    assert request.id is None
    assert request.outputs is None
    assert request.parameters == {}
    names = [t.name for t in request.inputs]
    assert names == ["INPUT0", "INPUT1", "INPUT2", "INPUT3"]
    first = request.inputs[0]
    assert first.datatype is DT["INT32"]
    assert first.shape == (1, 4)
    assert first.data.dtype == np.int32 and first.data.tolist() == [[1, 2, 3, 4]]
    assert request.inputs[1].data.tolist() == [0.5, 1.5]
    assert request.inputs[2].data.tolist() == [b"hi"]
    assert request.inputs[3].data.tolist() == [True, False]


def test_decode_id_parameters_and_outputs() -> None:
    header = {
        "id": "req-7",
        "parameters": {"binary_data_output": True, "custom": 5},
        "inputs": [_json_input()],
        "outputs": [
            {"name": "OUTPUT1", "parameters": {"binary_data": False}},
            {"name": "OUTPUT0"},
        ],
    }
    request = _decode(header)
    assert request.id == "req-7"
    assert request.parameters == {"binary_data_output": True, "custom": 5}
    assert request.outputs == [
        RequestedOutput("OUTPUT1", {"binary_data": False}),
        RequestedOutput("OUTPUT0", {}),
    ]


def test_decode_empty_outputs_list_asks_for_every_output() -> None:
    request = _decode({"inputs": [_json_input()], "outputs": []})
    assert request.outputs is None


def test_decode_input_parameters_kept() -> None:
    raw = _json_input()
    raw["parameters"] = {"something": "x"}
    assert _decode({"inputs": [raw]}).inputs[0].parameters == {"something": "x"}


def test_decode_json_count_mismatch_propagates() -> None:
    message = _invalid({"inputs": [_json_input(shape=[1, 3])]})
    assert message.startswith("Unable to parse 'data': Shape does not match true shape")
    assert "input 'INPUT0'" in message


# ---- decode_request: binary inputs -------------------------------------------------------


def test_decode_binary_inputs_are_views_of_the_body() -> None:
    a = np.arange(16, dtype=np.int32)
    b = np.arange(16, 32, dtype=np.int32)
    body = bytearray(a.tobytes() + b.tobytes())
    header = {
        "inputs": [
            _binary_input("INPUT0", "INT32", [1, 16], 64),
            _binary_input("INPUT1", "INT32", [1, 16], 64),
        ]
    }
    request = _decode(header, body)
    backing = np.frombuffer(body, dtype=np.uint8)
    assert request.inputs[0].data.tolist() == [a.tolist()]
    assert request.inputs[1].data.tolist() == [b.tolist()]
    for tensor in request.inputs:
        assert tensor.data.shape == (1, 16)
        assert np.shares_memory(tensor.data, backing)
    assert request.inputs[0].parameters == {"binary_data_size": 64}


def test_decode_mixed_json_and_binary_inputs_in_order() -> None:
    fp = np.array([1.5, 2.5], dtype=np.float32)
    strings = b"\x03\x00\x00\x00abc" + b"\x02\x00\x00\x00\x00\xff"
    i16 = np.array([7, -7, 9], dtype=np.int16)
    body = fp.tobytes() + strings + i16.tobytes()
    header = {
        "inputs": [
            _json_input("J0", "INT32", [2], [5, 6]),
            _binary_input("B0", "FP32", [2], 8),
            _json_input("J1", "BYTES", [1], ["text"]),
            _binary_input("B1", "BYTES", [2], len(strings)),
            _binary_input("B2", "INT16", [3], 6),
            _json_input("J2", "BOOL", [1], [True]),
        ]
    }
    request = _decode(header, body)
    assert [t.name for t in request.inputs] == ["J0", "B0", "J1", "B1", "B2", "J2"]
    values = [t.data.tolist() for t in request.inputs]
    assert values == [[5, 6], [1.5, 2.5], [b"text"], [b"abc", b"\x00\xff"], [7, -7, 9], [True]]


def test_decode_binary_zero_size_empty_tensor() -> None:
    header = {"inputs": [_binary_input("E", "FP32", [0, 3], 0), _binary_input("F", "INT8", [2], 2)]}
    request = _decode(header, b"\x01\x02")
    assert request.inputs[0].data.shape == (0, 3)
    assert request.inputs[1].data.tolist() == [1, 2]


def test_decode_binary_size_mismatch_with_shape() -> None:
    header: dict[str, Any] = {"inputs": [_binary_input("X", "FP32", [1, 8], 40)]}
    assert _invalid(header, b"\x00" * 40) == (
        "[request id: <id_unknown>] input byte size mismatch for input 'X' for model 'm'. "
        "Expected 32, got 40"
    )
    header["id"] = "7"
    assert _invalid(header, b"\x00" * 40).startswith("[request id: 7] input byte size")


def test_decode_extra_trailing_bytes_refused() -> None:
    header = {"inputs": [_binary_input("X", "INT8", [4], 4)]}
    assert _invalid(header, b"\x00" * 7) == (
        "unexpected additional input data for model 'm': 3 bytes after the last binary input"
    )


def test_decode_binary_body_with_json_only_inputs_refused() -> None:
    assert "unexpected additional input data for model 'm': 2 bytes" in _invalid(
        {"inputs": [_json_input()]}, b"\x00\x00"
    )


def test_decode_binary_input_without_inference_header() -> None:
    # Without Inference-Header-Content-Length the whole body is JSON: no binary part at all.
    header = {"inputs": [_binary_input("X", "FP32", [1, 4], 16)]}
    assert _invalid(header, b"") == (
        "must specify valid 'Infer-Header-Content-Length' in request header and "
        "'binary_data_size' when passing inputs in binary data format"
    )


def test_decode_binary_data_shorter_than_declared() -> None:
    header = {
        "inputs": [
            _binary_input("A", "INT8", [4], 4),
            _binary_input("B", "INT8", [8], 8),
        ]
    }
    assert _invalid(header, b"\x00" * 10) == (
        "unexpected size for input 'B', expecting 8 additional bytes for model 'm'"
    )


# ---- decode_request: refusals naming the field ---------------------------------------------


def test_triton_parameter_refused() -> None:
    header = {"inputs": [_json_input()], "parameters": {"triton_enable_empty_final_response": True}}
    assert _invalid(header) == (
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not be "
        "specified."
    )


def test_non_reserved_parameter_with_triton_inside_is_fine() -> None:
    assert _decode({"inputs": [_json_input()], "parameters": {"my_triton_x": 1}}).parameters == {
        "my_triton_x": 1
    }


@pytest.mark.parametrize("header", [[], "x", 5, None, True])
def test_header_must_be_an_object(header: Any) -> None:
    assert _invalid(header) == "the inference request must be a JSON object"


def test_missing_inputs() -> None:
    assert _invalid({"outputs": []}) == "missing 'inputs' in the inference request"


@pytest.mark.parametrize("value", [{}, "INPUT0", 3, None, True])
def test_inputs_must_be_a_list(value: Any) -> None:
    assert _invalid({"inputs": value}) == "Unable to parse 'inputs' of the request: expected list"


@pytest.mark.parametrize("value", [5, True, None, ["a"], {"a": 1}])
def test_id_must_be_a_string(value: Any) -> None:
    assert _invalid({"inputs": [_json_input()], "id": value}) == (
        "Unable to parse 'id' of the request: expected str"
    )


@pytest.mark.parametrize("value", [[], "x", 1, None, True])
def test_request_parameters_must_be_an_object(value: Any) -> None:
    assert _invalid({"inputs": [_json_input()], "parameters": value}) == (
        "Unable to parse 'parameters' of the request: expected an object"
    )


@pytest.mark.parametrize("value", [1, 0, "true", None, []])
def test_binary_data_output_must_be_a_boolean(value: Any) -> None:
    header = {"inputs": [_json_input()], "parameters": {"binary_data_output": value}}
    assert _invalid(header) == "Unable to parse 'binary_data_output': expected a boolean"


@pytest.mark.parametrize("value", ["INPUT0", 1, None, ["INPUT0"]])
def test_input_must_be_an_object(value: Any) -> None:
    assert _invalid({"inputs": [value]}) == "each element of 'inputs' must be a JSON object"


@pytest.mark.parametrize("key", ["name", "shape", "datatype"])
def test_input_missing_key(key: str) -> None:
    raw = _json_input()
    del raw[key]
    assert _invalid({"inputs": [raw]}) == f"missing '{key}' in an input of the inference request"


@pytest.mark.parametrize("value", [1, None, True, ["INPUT0"]])
def test_input_name_must_be_a_string(value: Any) -> None:
    raw = _json_input()
    raw["name"] = value
    assert _invalid({"inputs": [raw]}) == "Unable to parse 'name' of an input: expected str"


@pytest.mark.parametrize(
    "value", [4, "1,4", None, [1, -1], [1, 4.0], [True, 4], [[1], 4], {"a": 1}]
)
def test_input_shape_must_be_non_negative_integers(value: Any) -> None:
    raw = _json_input()
    raw["shape"] = value
    assert _invalid({"inputs": [raw]}) == (
        "Unable to parse 'shape' of input 'INPUT0': expected an array of non-negative integers"
    )


@pytest.mark.parametrize("value", ["FLOAT32", "int32", 5, None, True])
def test_input_datatype_must_be_a_v2_name(value: Any) -> None:
    raw = _json_input()
    raw["datatype"] = value
    message = _invalid({"inputs": [raw]})
    assert message.startswith(f"invalid datatype {value!r}: expected one of ")


@pytest.mark.parametrize("value", [[], "x", 1, True])
def test_input_parameters_must_be_an_object(value: Any) -> None:
    raw = _json_input()
    raw["parameters"] = value
    assert _invalid({"inputs": [raw]}) == (
        "Unable to parse 'parameters' of input 'INPUT0': expected an object"
    )


@pytest.mark.parametrize("value", [-1, 1.0, "16", None, True, [16]])
def test_binary_data_size_must_be_a_non_negative_integer(value: Any) -> None:
    raw = _binary_input("X", "INT8", [1], 1)
    raw["parameters"]["binary_data_size"] = value
    assert _invalid({"inputs": [raw]}, b"\x00") == (
        "Unable to parse 'binary_data_size' of input 'X': expected a non-negative integer"
    )


ONE_SOURCE = (
    "Input must set only one of the following fields: 'data', 'binary_data_size' in "
    "'parameters', 'shared_memory_region' in 'parameters'. But set "
)


def test_input_with_both_data_and_binary_data_size_refused() -> None:
    """Triton refuses it (and so must we: the binary part used to win silently)."""
    both = {**_binary_input("INPUT0", "INT32", [1, 4], 16), "data": [1, 2, 3, 4]}
    blob = np.arange(4, dtype=np.int32).tobytes()
    assert _invalid({"inputs": [both]}, blob) == (
        f"{ONE_SOURCE}'data' 'binary_data_size' (input 'INPUT0')"
    )


SHM = {"shared_memory_region": "r", "shared_memory_byte_size": 16}


@pytest.mark.parametrize(
    "data, params, named",
    [
        ([1, 2, 3, 4], SHM, "'data' 'shared_memory_region'"),
        (None, {**SHM, "binary_data_size": 16}, "'binary_data_size' 'shared_memory_region'"),
    ],
)
def test_input_in_shared_memory_with_data_too_refused(
    data: list[int] | None, params: dict[str, Any], named: str
) -> None:
    raw: dict[str, Any] = {"name": "INPUT0", "datatype": "INT32", "shape": [1, 4], "parameters": params}
    if data is not None:
        raw["data"] = data
    assert _invalid({"inputs": [raw]}, b"\0" * 16) == f"{ONE_SOURCE}{named} (input 'INPUT0')"


def test_json_data_is_bounded_by_what_it_decodes_to() -> None:
    """``0,`` is two characters and eight bytes of FP64: the decoded size is charged to the
    body limit, before any array is made, over all inputs together."""
    header = {"inputs": [
        _json_input("A", "FP64", [1, 8], [0] * 8),
        _json_input("B", "FP64", [1, 8], [0] * 8),
    ]}
    assert len(decode_request(header, EMPTY, "m", "1", max_data_bytes=128).inputs) == 2
    with pytest.raises(InvalidArgument) as caught:
        decode_request(header, EMPTY, "m", "1", max_data_bytes=127)
    assert caught.value.message == (
        "request JSON data of 128 bytes (decoded, up to input 'B') exceeds the maximum allowed "
        "input size of 127 bytes. Use --http-max-input-size to increase the limit."
    )
    # BYTES elements are charged a pointer each; the shape, not the data, is what counts
    strings = {"inputs": [_json_input("S", "BYTES", [10**9], ["a"])]}
    with pytest.raises(InvalidArgument, match="request JSON data of 8000000000 bytes"):
        decode_request(strings, EMPTY, "m", "1", max_data_bytes=1 << 26)


def test_input_without_data_or_binary_size() -> None:
    raw = _json_input()
    del raw["data"]
    assert _invalid({"inputs": [raw]}) == "input 'INPUT0' has neither 'data' nor 'binary_data_size'"


@pytest.mark.parametrize("value", [{}, "OUTPUT0", 1, True])
def test_outputs_must_be_a_list(value: Any) -> None:
    assert _invalid({"inputs": [_json_input()], "outputs": value}) == (
        "Unable to parse 'outputs' of the request: expected list"
    )


@pytest.mark.parametrize("value", ["OUTPUT0", 1, None, {}, {"parameters": {}}])
def test_output_must_be_an_object_with_a_name(value: Any) -> None:
    assert _invalid({"inputs": [_json_input()], "outputs": [value]}) == (
        "each element of 'outputs' must be an object with a 'name'"
    )


@pytest.mark.parametrize("value", [1, None, True, ["OUTPUT0"]])
def test_output_name_must_be_a_string(value: Any) -> None:
    assert _invalid({"inputs": [_json_input()], "outputs": [{"name": value}]}) == (
        "Unable to parse 'name' of an output: expected str"
    )


@pytest.mark.parametrize("value", [[], "x", 1, True])
def test_output_parameters_must_be_an_object(value: Any) -> None:
    header = {"inputs": [_json_input()], "outputs": [{"name": "O", "parameters": value}]}
    assert _invalid(header) == "Unable to parse 'parameters' of output 'O': expected an object"


@pytest.mark.parametrize("value", [1, 0, "true", None])
def test_output_binary_data_must_be_a_boolean(value: Any) -> None:
    header = {
        "inputs": [_json_input()],
        "outputs": [{"name": "O", "parameters": {"binary_data": value}}],
    }
    assert _invalid(header) == "Unable to parse 'binary_data' of output 'O': expected a boolean"


@pytest.mark.parametrize("count", [0, 3, 2**40])
def test_output_classification_count_is_kept(count: int) -> None:
    header = {
        "inputs": [_json_input()],
        "outputs": [{"name": "O", "parameters": {"classification": count}}],
    }
    (output,) = _decode(header).outputs or []
    assert output.parameters == {"classification": count}


@pytest.mark.parametrize("value", [-1, "3", 2.0, True, None, [3]])
def test_output_classification_must_be_an_unsigned_integer(value: Any) -> None:
    header = {
        "inputs": [_json_input()],
        "outputs": [{"name": "O", "parameters": {"classification": value}}],
    }
    assert _invalid(header) == (
        "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
        "unsigned-integer"
    )


def test_output_classification_refused_in_shared_memory() -> None:
    params = {"classification": 2, "shared_memory_region": "r", "shared_memory_byte_size": 64}
    header = {"inputs": [_json_input()], "outputs": [{"name": "O", "parameters": params}]}
    assert _invalid(header) == (
        "Output can't set both 'shared_memory_region' and 'classification'"
    )


# ---- decode_raw_request ------------------------------------------------------------------


def _config(text: str) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def test_raw_request_needs_exactly_one_input() -> None:
    config = _config(
        'name: "multi" '
        'input { name: "A" data_type: TYPE_FP32 dims: [1] } '
        'input { name: "B" data_type: TYPE_FP32 dims: [1] } '
        'input { name: "C" data_type: TYPE_FP32 dims: [1] }'
    )
    with pytest.raises(InvalidArgument) as err:
        decode_raw_request(memoryview(b"\x00" * 4), ModelSpec.from_config(config), "1")
    assert str(err.value) == (
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be deduced "
        "but got 3 inputs in "
        "'multi' model configuration"
    )


def test_raw_request_two_variable_dims() -> None:
    config = _config(
        'name: "m" max_batch_size: 4 input { name: "INPUT0" data_type: TYPE_FP16 dims: [-1, -1] }'
    )
    with pytest.raises(InvalidArgument) as err:
        decode_raw_request(memoryview(b"\x00" * 4), ModelSpec.from_config(config), "1")
    assert str(err.value) == (
        "[request id: <id_unknown>] The shape of the raw input 'INPUT0' can not be deduced because there are more than one "
        "variable-sized dimension"
    )


@pytest.mark.parametrize("dims", ["[2]", "[-1]", "[1, 1]"])
def test_raw_request_bytes_needs_shape_one(dims: str) -> None:
    config = _config(f'name: "m" input {{ name: "INPUT0" data_type: TYPE_STRING dims: {dims} }}')
    with pytest.raises(InvalidArgument) as err:
        decode_raw_request(memoryview(b"abc"), ModelSpec.from_config(config), "1")
    assert str(err.value) == (
        "[request id: <id_unknown>] For BYTE datatype raw input 'INPUT0', the model must have input shape [1]"
    )


def test_raw_request_deduces_the_variable_dim_with_batching() -> None:
    config = _config(
        'name: "raw" max_batch_size: 8 input { name: "INPUT0" data_type: TYPE_FP32 dims: [-1] }'
    )
    body = bytearray(np.arange(5, dtype=np.float32).tobytes())
    request = decode_raw_request(memoryview(body), ModelSpec.from_config(config), "3")
    assert request.model_name == "raw" and request.model_version == "3"
    assert request.parameters == {"binary_data_output": True}
    assert request.outputs is None and request.id is None
    (tensor,) = request.inputs
    assert tensor.name == "INPUT0" and tensor.datatype is DT["FP32"]
    assert tensor.shape == (1, 5)
    assert tensor.data.shape == (1, 5)
    assert tensor.data.tolist() == [[0.0, 1.0, 2.0, 3.0, 4.0]]
    assert np.shares_memory(tensor.data, np.frombuffer(body, dtype=np.uint8))


def test_raw_request_deduces_a_middle_variable_dim_without_batching() -> None:
    config = _config('name: "raw" input { name: "X" data_type: TYPE_INT16 dims: [2, -1, 3] }')
    body = np.arange(24, dtype=np.int16).tobytes()
    request = decode_raw_request(memoryview(body), ModelSpec.from_config(config), "1")
    assert request.inputs[0].shape == (2, 4, 3)
    assert request.inputs[0].data.reshape(-1).tolist() == list(range(24))


def test_raw_request_fixed_shape() -> None:
    config = _config(
        'name: "raw" max_batch_size: 2 input { name: "X" data_type: TYPE_INT32 dims: [4] }'
    )
    request = decode_raw_request(memoryview(np.arange(4, dtype=np.int32).tobytes()), ModelSpec.from_config(config), "1")
    assert request.inputs[0].shape == (1, 4)
    assert request.inputs[0].data.tolist() == [[0, 1, 2, 3]]


def test_raw_request_fixed_shape_size_mismatch() -> None:
    config = _config(
        'name: "raw" max_batch_size: 2 input { name: "X" data_type: TYPE_INT32 dims: [4] }'
    )
    with pytest.raises(InvalidArgument) as err:
        decode_raw_request(memoryview(b"\x00" * 20), ModelSpec.from_config(config), "1")
    assert (
        str(err.value)
        == "[request id: <id_unknown>] input byte size mismatch for input 'X' for model 'raw'. "
        "Expected 16, got 20"
    )


def test_raw_request_not_a_whole_number_of_elements() -> None:
    config = _config('name: "raw" input { name: "X" data_type: TYPE_FP32 dims: [-1, 2] }')
    with pytest.raises(InvalidArgument) as err:
        decode_raw_request(memoryview(b"\x00" * 12), ModelSpec.from_config(config), "1")
    assert str(err.value) == (
        "the raw input 'X' of 12 bytes is not a whole number of elements of shape [-1, 2] for "
        "model 'raw'"
    )


@pytest.mark.parametrize("batching,shape", [(True, (1, 1)), (False, (1,))])
def test_raw_request_bytes_is_the_element_itself(batching: bool, shape: tuple[int, ...]) -> None:
    mbs = 4 if batching else 0
    config = _config(
        f'name: "s" max_batch_size: {mbs} input {{ name: "S" data_type: TYPE_STRING dims: [1] }}'
    )
    body = b"\x00\xffraw bytes, not length-prefixed"
    request = decode_raw_request(memoryview(body), ModelSpec.from_config(config), "1")
    (tensor,) = request.inputs
    assert tensor.datatype is DT["BYTES"]
    assert tensor.shape == shape
    assert tensor.data.shape == shape
    assert tensor.data.reshape(-1).tolist() == [body]
    assert request.parameters == {"binary_data_output": True}


# ---- encode_response ---------------------------------------------------------------------


def _objects(items: list[bytes]) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out


def _response(id: str | None = None) -> InferResponse:
    return InferResponse(
        "m",
        "1",
        [
            OutputTensor("OUT_A", DT["INT32"], (2, 2), np.array([[1, 2], [3, 4]], dtype=np.int32)),
            OutputTensor("OUT_B", DT["FP32"], (3,), np.array([0.5, -1.0, 2.0], dtype=np.float32)),
            OutputTensor("OUT_C", DT["BYTES"], (2,), _objects([b"x\x00", b"\xffy"])),
        ],
        id=id,
    )


def _request(
    params: dict[str, Any] | None = None, outputs: list[RequestedOutput] | None = None
) -> InferRequest:
    return InferRequest("m", "1", [], outputs, None, params or {})


def _header(encoded: EncodedResponse) -> dict[str, Any]:
    body: dict[str, Any] = orjson.loads(encoded.header)
    return body


def test_encode_json_response() -> None:
    encoded = encode_response(_response(), _request())
    assert not encoded.binary and encoded.blobs == []
    assert encoded.size == len(encoded.header)
    body = _header(encoded)
    assert "id" not in body and "parameters" not in body
    assert body == {
        "model_name": "m",
        "model_version": "1",
        "outputs": [
            {"name": "OUT_A", "datatype": "INT32", "shape": [2, 2], "data": [1, 2, 3, 4]},
            {"name": "OUT_B", "datatype": "FP32", "shape": [3], "data": [0.5, -1.0, 2.0]},
            {"name": "OUT_C", "datatype": "BYTES", "shape": [2], "data": ["x\u0000", "\ufffdy"]},
        ],
    }


def test_encode_echoes_id_and_parameters() -> None:
    response = _response(id="abc")
    response.parameters = {"sequence_end": True}
    body = _header(encode_response(response, _request()))
    assert body["id"] == "abc"
    assert body["parameters"] == {"sequence_end": True}


def test_encode_all_binary_with_binary_data_output() -> None:
    response = _response()
    encoded = encode_response(response, _request({"binary_data_output": True}))
    body = _header(encoded)
    assert encoded.binary
    sizes = []
    for entry in body["outputs"]:
        assert "data" not in entry
        assert set(entry["parameters"]) == {"binary_data_size"}
        sizes.append(entry["parameters"]["binary_data_size"])
    assert [blob.nbytes for blob in encoded.blobs] == sizes == [16, 12, 12]
    assert bytes(encoded.blobs[0]) == np.array([1, 2, 3, 4], dtype=np.int32).tobytes()
    assert bytes(encoded.blobs[1]) == np.array([0.5, -1.0, 2.0], dtype=np.float32).tobytes()
    assert bytes(encoded.blobs[2]) == b"\x02\x00\x00\x00x\x00\x02\x00\x00\x00\xffy"
    assert encoded.size == len(encoded.header) + 40
    # shape and datatype still present
    assert body["outputs"][0]["shape"] == [2, 2] and body["outputs"][0]["datatype"] == "INT32"


def test_encode_binary_blob_is_a_view_of_the_output() -> None:
    response = _response()
    encoded = encode_response(response, _request({"binary_data_output": True}))
    assert np.shares_memory(
        np.frombuffer(encoded.blobs[0], dtype=np.uint8), response.outputs[0].data
    )


def test_per_output_binary_data_false_overrides_request_default() -> None:
    request = _request(
        {"binary_data_output": True},
        [RequestedOutput("OUT_B", {"binary_data": False})],
    )
    encoded = encode_response(_response(), request)
    outputs = _header(encoded)["outputs"]
    assert "data" not in outputs[0] and outputs[0]["parameters"]["binary_data_size"] == 16
    assert outputs[1]["data"] == [0.5, -1.0, 2.0] and "parameters" not in outputs[1]
    # OUT_C is not listed: request-level default applies to it too.
    assert "data" not in outputs[2]
    assert [b.nbytes for b in encoded.blobs] == [16, 12]


def test_per_output_binary_data_true_overrides_json_default() -> None:
    request = _request(
        {"binary_data_output": False},
        [RequestedOutput("OUT_A", {}), RequestedOutput("OUT_C", {"binary_data": True})],
    )
    encoded = encode_response(_response(), request)
    outputs = _header(encoded)["outputs"]
    assert outputs[0]["data"] == [1, 2, 3, 4]
    assert outputs[1]["data"] == [0.5, -1.0, 2.0]
    assert outputs[2]["parameters"] == {"binary_data_size": 12} and "data" not in outputs[2]
    assert len(encoded.blobs) == 1
    assert bytes(encoded.blobs[0]).endswith(b"\xffy")


def test_listed_output_without_binary_data_follows_request_default() -> None:
    request = _request({"binary_data_output": True}, [RequestedOutput("OUT_A", {})])
    outputs = _header(encode_response(_response(), request))["outputs"]
    assert "data" not in outputs[0]


def test_blobs_in_output_order() -> None:
    response = InferResponse(
        "m",
        "1",
        [
            OutputTensor("Z", DT["INT8"], (1,), np.array([1], dtype=np.int8)),
            OutputTensor("A", DT["INT8"], (2,), np.array([2, 3], dtype=np.int8)),
            OutputTensor("M", DT["INT8"], (3,), np.array([4, 5, 6], dtype=np.int8)),
        ],
    )
    request = _request(
        outputs=[
            RequestedOutput("M", {"binary_data": True}),
            RequestedOutput("A", {"binary_data": False}),
            RequestedOutput("Z", {"binary_data": True}),
        ]
    )
    encoded = encode_response(response, request)
    body = _header(encoded)
    assert [o["name"] for o in body["outputs"]] == ["Z", "A", "M"]
    assert [bytes(b) for b in encoded.blobs] == [b"\x01", b"\x04\x05\x06"]
    assert body["outputs"][1]["data"] == [2, 3]


def test_encode_fp16_bf16_and_bool_as_json() -> None:
    import ml_dtypes

    response = InferResponse(
        "m",
        "1",
        [
            OutputTensor("H", DT["FP16"], (2,), np.array([1.5, -2.0], dtype=np.float16)),
            OutputTensor("B", DT["BF16"], (1,), np.array([0.5], dtype=ml_dtypes.bfloat16)),
            OutputTensor("T", DT["BOOL"], (2,), np.array([True, False])),
            OutputTensor("U", DT["UINT64"], (1,), np.array([2**64 - 1], dtype=np.uint64)),
        ],
    )
    outputs = _header(encode_response(response, _request()))["outputs"]
    assert [o["data"] for o in outputs] == [[1.5, -2.0], [0.5], [True, False], [2**64 - 1]]


def test_encode_raw_request_response_is_all_binary() -> None:
    config = _config(
        'name: "m" max_batch_size: 4 input { name: "X" data_type: TYPE_INT32 dims: [-1] }'
    )
    request = decode_raw_request(memoryview(np.arange(3, dtype=np.int32).tobytes()), ModelSpec.from_config(config), "1")
    encoded = encode_response(_response(), request)
    assert len(encoded.blobs) == 3
    assert all("data" not in o for o in _header(encoded)["outputs"])


def test_encode_empty_output() -> None:
    response = InferResponse(
        "m", "1", [OutputTensor("E", DT["FP32"], (0, 2), np.empty((0, 2), np.float32))]
    )
    json_out = _header(encode_response(response, _request()))["outputs"][0]
    assert json_out["data"] == [] and json_out["shape"] == [0, 2]
    encoded = encode_response(response, _request({"binary_data_output": True}))
    assert _header(encoded)["outputs"][0]["parameters"] == {"binary_data_size": 0}
    assert encoded.blobs[0].nbytes == 0


def test_bytes_binary_round_trip_through_decode() -> None:
    """A BYTES output written binary decodes back byte for byte as a binary input."""
    items = [b"", b"\x00", b"\xff\xfe\x00", b"ok"]
    response = InferResponse("m", "1", [OutputTensor("S", DT["BYTES"], (4,), _objects(items))])
    encoded = encode_response(response, _request({"binary_data_output": True}))
    blob = bytes(encoded.blobs[0])
    header = {"inputs": [_binary_input("S", "BYTES", [4], len(blob))]}
    request = _decode(header, blob)
    assert request.inputs[0].data.tolist() == items


def test_encoding_cost_counts_only_what_encoding_converts_or_copies() -> None:
    response = _response()
    a, b, c = (o.data.nbytes for o in response.outputs)
    assert encoding_cost(response, _request()) == a + b + c  # all JSON
    assert encoding_cost(response, _request({"binary_data_output": True})) == c  # BYTES framed
    one_binary = [RequestedOutput("OUT_A", {"binary_data": True})]
    assert encoding_cost(response, _request(outputs=one_binary)) == b + c
    strided = np.arange(8, dtype=np.int32).reshape(2, 4)[:, ::2]
    big_endian = np.array([1.0, 2.0, 3.0], dtype=">f4")
    response.outputs[0].data, response.outputs[1].data = strided, big_endian
    assert encoding_cost(response, _request({"binary_data_output": True})) == (
        strided.nbytes + big_endian.nbytes + c
    )
