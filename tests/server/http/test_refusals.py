"""Every refusal is a 4xx with a ``{"error": ...}`` JSON body, and the server keeps serving.

Texts are Triton's where triton-facts (§1.3, §1.4, §7.1, §7.2) lists them; elsewhere the
message must name the offending field (DESIGN.md: every client mistake is a 400 naming it).
"""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest

from tests.server.http.helpers import (
    Response,
    assert_simple_ok,
    binary_body,
    chunked_request,
    error_of,
    json_input,
    parse_raw_response,
    post_json,
    raw_exchange,
    read_response,
    serialize_bytes,
    simple_request,
)
from tests.server_process import EXAMPLES, ServerProcess, start_server
from tests.triton_texts import BATCH_NOTE, NO_ID

pytestmark = pytest.mark.usefixtures("assert_still_serving")

LIMIT = 1024


def _refused(response: Response, status: int = 400) -> str:
    assert response[0] == status, response
    return error_of(response)


def _fp32(dims: Any, data: Any = None, /, **fields: Any) -> dict[str, Any]:
    """A one-input request for identity_fp32 with ``fields`` overriding the input's."""
    tensor: dict[str, Any] = {"name": "INPUT0", "datatype": "FP32", "shape": dims}
    if data is not None:
        tensor["data"] = data
    tensor.update(fields)
    return {"inputs": [tensor]}


# --- malformed bodies -------------------------------------------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"{",
        b"{bad json}",
        b'{"inputs": [}',
        b"\xff\xfe\x00",
        b"nul\x00l",
        b"[1, 2",
        b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [NaN]}]}',
        b'{"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1e999]}]}',
    ],
    ids=[
        "empty",
        "open-brace",
        "garbage",
        "broken-array",
        "not-utf8",
        "nul",
        "unterminated",
        "nan-literal",
        "infinite-literal",
    ],
)
def test_malformed_json(server: ServerProcess, body: bytes) -> None:
    _refused(post_json(server, "identity_fp32", body))


@pytest.mark.parametrize("body", [b"[]", b"1", b'"inputs"', b"null", b"true", b"[{}]"])
def test_non_object_json(server: ServerProcess, body: bytes) -> None:
    _refused(post_json(server, "identity_fp32", body))


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"input": []},
        {"inputs": None},
        {"inputs": {}},
        {"inputs": "INPUT0"},
        {"inputs": [1]},
        {"inputs": [None]},
        {"inputs": [[]]},
    ],
    ids=[
        "empty-object",
        "misspelt",
        "null",
        "object",
        "string",
        "number",
        "null-item",
        "list-item",
    ],
)
def test_missing_or_invalid_inputs(server: ServerProcess, body: Any) -> None:
    message = _refused(post_json(server, "identity_fp32", body))
    assert "input" in message


@pytest.mark.parametrize("missing", ["name", "shape", "datatype"])
def test_input_field_missing(server: ServerProcess, missing: str) -> None:
    body = _fp32([1, 2], [1, 2])
    del body["inputs"][0][missing]
    assert missing in _refused(post_json(server, "identity_fp32", body))


def test_input_without_data(server: ServerProcess) -> None:
    _refused(post_json(server, "identity_fp32", _fp32([1, 2])))


# --- wrong types for fields -------------------------------------------------------------------


FIELD_TYPES = [
    pytest.param({"name": 5}, "name", id="name-number"),
    pytest.param({"name": None}, "name", id="name-null"),
    pytest.param({"name": ["INPUT0"]}, "name", id="name-list"),
    pytest.param({"shape": "1,2"}, "shape", id="shape-string"),
    pytest.param({"shape": 2}, "shape", id="shape-number"),
    pytest.param({"shape": [1, "2"]}, "shape", id="shape-string-dim"),
    pytest.param({"shape": [1, True]}, "shape", id="shape-bool-dim"),
    pytest.param({"shape": [1, None]}, "shape", id="shape-null-dim"),
    pytest.param({"shape": [1, [2]]}, "shape", id="shape-nested"),
    pytest.param({"shape": {"0": 1}}, "shape", id="shape-object"),
    pytest.param({"datatype": 11}, "datatype", id="datatype-number"),
    pytest.param({"datatype": "FLOAT"}, "datatype", id="datatype-unknown"),
    pytest.param({"datatype": "fp32"}, "datatype", id="datatype-lowercase"),
    pytest.param({"datatype": None}, "datatype", id="datatype-null"),
    pytest.param({"parameters": []}, "parameters", id="parameters-list"),
    pytest.param({"parameters": "x"}, "parameters", id="parameters-string"),
    pytest.param(
        {"parameters": {"binary_data_size": "8"}}, "binary_data_size", id="binary_data_size-string"
    ),
    pytest.param(
        {"parameters": {"binary_data_size": 8.0}}, "binary_data_size", id="binary_data_size-float"
    ),
    pytest.param(
        {"parameters": {"binary_data_size": -8}}, "binary_data_size", id="binary_data_size-negative"
    ),
    pytest.param(
        {"parameters": {"binary_data_size": True}}, "binary_data_size", id="binary_data_size-bool"
    ),
    pytest.param(
        {"parameters": {"binary_data_size": None}}, "binary_data_size", id="binary_data_size-null"
    ),
]


@pytest.mark.parametrize(("fields", "named"), FIELD_TYPES)
def test_input_field_wrong_type(server: ServerProcess, fields: dict[str, Any], named: str) -> None:
    body = _fp32([1, 2], [1.0, 2.0], **fields)
    assert named in _refused(post_json(server, "identity_fp32", body))


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        pytest.param(
            {"outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": "yes"}}]},
            "binary_data",
            id="binary_data-string",
        ),
        pytest.param(
            {"outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": 1}}]},
            "binary_data",
            id="binary_data-number",
        ),
        pytest.param(
            {"outputs": [{"name": "OUTPUT0", "parameters": []}]},
            "parameters",
            id="output-parameters-list",
        ),
        pytest.param({"outputs": [{"name": 0}]}, "name", id="output-name-number"),
        pytest.param({"outputs": [{}]}, "name", id="output-without-name"),
        pytest.param({"outputs": {"name": "OUTPUT0"}}, "outputs", id="outputs-object"),
        pytest.param({"outputs": ["OUTPUT0"]}, "outputs", id="outputs-strings"),
        pytest.param(
            {"parameters": {"binary_data_output": "true"}},
            "binary_data_output",
            id="binary_data_output-string",
        ),
        pytest.param({"parameters": [1]}, "parameters", id="parameters-list"),
        pytest.param({"id": 5}, "id", id="id-number"),
        pytest.param({"id": ["a"]}, "id", id="id-list"),
    ],
)
def test_request_field_wrong_type(server: ServerProcess, extra: dict[str, Any], named: str) -> None:
    body = {**_fp32([1, 2], [1.0, 2.0]), **extra}
    assert named in _refused(post_json(server, "identity_fp32", body))


# --- shapes -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape",
    [[1, -2], [-1, 2], [1, 2.0], [1.5, 2], [1, 1e1]],
    ids=["negative", "minus-one", "float-integral", "fractional", "exponent"],
)
def test_bad_dims(server: ServerProcess, shape: list[Any]) -> None:
    body = _fp32(shape, [1.0, 2.0])
    assert "shape" in _refused(post_json(server, "identity_fp32", body))


@pytest.mark.parametrize(
    ("shape", "data"),
    [
        ([2**4, 2**60 + 2], [1.0]),
        ([0, 2**62], []),
        ([2**62, 0], []),
        ([2**32, 2**32], []),
        ([1, 2**63], []),
    ],
    ids=["huge", "zero-times-huge", "huge-times-zero", "product-wraps-to-zero", "int64-overflow"],
)
def test_absurd_json_shape(server: ServerProcess, shape: list[int], data: list[float]) -> None:
    """Element counts no array can hold are the client's mistake (400), never a 500."""
    _refused(post_json(server, "identity_fp32", _fp32(shape, data)))


@pytest.mark.parametrize(
    ("shape", "size"),
    [([1, 2**62], 8), ([2**40, 2**40], 8), ([0, 2**62], 0), ([2**62, 0], 0)],
    ids=["huge", "overflowing", "zero-times-huge", "huge-times-zero"],
)
def test_absurd_binary_shape(server: ServerProcess, shape: list[int], size: int) -> None:
    """Element counts no array can hold are the client's mistake (400), never a 500."""
    header = _fp32(shape, parameters={"binary_data_size": size})
    body, headers = binary_body(header, b"\x00" * size)
    _refused(post_json(server, "identity_fp32", body, headers))


def test_wrong_rank(server: ServerProcess) -> None:
    body = {
        "inputs": [
            json_input("INPUT0", "INT32", [1, 1, 16], list(range(16))),
            json_input("INPUT1", "INT32", [1, 1, 16], list(range(16))),
        ]
    }
    message = _refused(post_json(server, "simple", body))
    assert message == NO_ID + (
        "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got "
        f"[1,1,16]. {BATCH_NOTE}"
    )


def test_wrong_dim(server: ServerProcess) -> None:
    body = {
        "inputs": [
            json_input("INPUT0", "INT32", [2, 8], list(range(16))),
            json_input("INPUT1", "INT32", [2, 8], list(range(16))),
        ]
    }
    message = _refused(post_json(server, "simple", body))
    assert message == NO_ID + (
        f"unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [2,8]. "
        f"{BATCH_NOTE}"
    )


def test_non_batching_model_with_batch_dim(server: ServerProcess) -> None:
    body = {"inputs": [json_input("INPUT0", "FP32", [1, 8], [0.0] * 8)]}
    message = _refused(post_json(server, "nobatch_fp32", body))
    # Triton's text ends at ". " here: no note for a model that does not batch.
    assert message == NO_ID + (
        "unexpected shape for input 'INPUT0' for model 'nobatch_fp32'. Expected [8], got [1,8]. "
    )


def test_batch_larger_than_max_batch_size(server: ServerProcess) -> None:
    body = {
        "inputs": [
            json_input("INPUT0", "INT32", [9, 16], [0] * 144),
            json_input("INPUT1", "INT32", [9, 16], [0] * 144),
        ],
        "id": "1",
    }
    # As NVIDIA's image client is answered, sending 2 images to densenet_onnx (at most 1).
    message = _refused(post_json(server, "simple", body))
    assert message == "[request id: 1] inference request batch-size must be <= 8 for 'simple'"


def test_inputs_with_different_batch_sizes(server: ServerProcess) -> None:
    body = {
        "inputs": [
            json_input("INPUT0", "INT32", [1, 16], [0] * 16),
            json_input("INPUT1", "INT32", [2, 16], [0] * 32),
        ]
    }
    assert _refused(post_json(server, "simple", body)) == NO_ID + (
        "input 'INPUT1' batch size does not match other inputs for 'simple'"
    )


# --- data values ------------------------------------------------------------------------------


DATA_VALUES = [
    pytest.param("simple", "INT32", [True] + [1] * 15, id="bool-in-int32"),
    pytest.param("simple", "INT32", [1.5] + [1] * 15, id="float-in-int32"),
    pytest.param("simple", "INT32", [1.0] + [1] * 15, id="integral-float-in-int32"),
    pytest.param("simple", "INT32", ["1"] + [1] * 15, id="string-in-int32"),
    pytest.param("simple", "INT32", [None] + [1] * 15, id="null-in-int32"),
    pytest.param("simple", "INT32", [2**31] + [1] * 15, id="int32-overflow"),
    pytest.param("dt_int8", "INT8", [300], id="300-as-int8"),
    pytest.param("dt_int8", "INT8", [-129], id="minus-129-as-int8"),
    pytest.param("dt_uint8", "UINT8", [-1], id="minus-1-as-uint8"),
    pytest.param("dt_uint8", "UINT8", [256], id="256-as-uint8"),
    pytest.param("dt_uint64", "UINT64", [2**64], id="uint64-overflow"),
    pytest.param("dt_int64", "INT64", [2**63], id="int64-overflow"),
    pytest.param("dt_int64", "INT64", [-(2**63) - 1], id="int64-underflow"),
    pytest.param("dt_fp32", "FP32", [1e39], id="fp32-overflow"),
    pytest.param("dt_fp32", "FP32", [-1e39], id="fp32-negative-overflow"),
    pytest.param("dt_fp16", "FP16", [70000.0], id="fp16-overflow"),
    pytest.param("dt_fp32", "FP32", [True], id="bool-in-fp32"),
    pytest.param("dt_fp32", "FP32", ["1.0"], id="string-in-fp32"),
    pytest.param("dt_bool", "BOOL", [1], id="number-in-bool"),
    pytest.param("dt_bool", "BOOL", ["true"], id="string-in-bool"),
    pytest.param("dt_bytes", "BYTES", [1], id="number-in-bytes"),
    pytest.param("dt_bytes", "BYTES", [None], id="null-in-bytes"),
    pytest.param("dt_bytes", "BYTES", [{"b64": "AA=="}], id="object-in-bytes"),
]


@pytest.mark.parametrize(("model", "datatype", "values"), DATA_VALUES)
def test_bad_data_values(
    server: ServerProcess, model: str, datatype: str, values: list[Any]
) -> None:
    if model == "simple":
        body = {
            "inputs": [
                json_input("INPUT0", datatype, [1, 16], values),
                json_input("INPUT1", datatype, [1, 16], [1] * 16),
            ]
        }
    else:
        body = {"inputs": [json_input("INPUT0", datatype, [1, len(values)], values)]}
    message = _refused(post_json(server, model, body))
    assert "data" in message and "INPUT0" in message


def test_bool_in_int32_named(server: ServerProcess) -> None:
    body = {
        "inputs": [
            json_input("INPUT0", "INT32", [1, 16], [True] + [1] * 15),
            json_input("INPUT1", "INT32", [1, 16], [1] * 16),
        ]
    }
    assert _refused(post_json(server, "simple", body)) == (
        "unable to parse 'data' of input 'INPUT0': INT32 elements must be integers"
    )


@pytest.mark.parametrize("count", [15, 17, 0, 32])
def test_element_count_mismatch(server: ServerProcess, count: int) -> None:
    body = {
        "inputs": [
            json_input("INPUT0", "INT32", [1, 16], list(range(count))),
            json_input("INPUT1", "INT32", [1, 16], [1] * 16),
        ]
    }
    message = _refused(post_json(server, "simple", body))
    # Triton's texts: too few -> "Failed to parse 'data' field: shape does not match true
    # shape"; too many -> "Unable to parse 'data': Shape does not match true shape of 'data'".
    if count < 16:
        assert message.startswith("Failed to parse 'data' field")
        assert "shape does not match true shape" in message
    else:
        assert message.startswith("Unable to parse 'data'")
        assert "Shape does not match true shape of 'data' field" in message


def test_nested_data_with_wrong_row_lengths(server: ServerProcess) -> None:
    body = _fp32([2, 2], [[1.0, 2.0], [3.0]])
    _refused(post_json(server, "identity_fp32", body))


def test_scalar_data_for_many_elements(server: ServerProcess) -> None:
    _refused(post_json(server, "identity_fp32", _fp32([1, 2], 1.0)))


# --- binary data ------------------------------------------------------------------------------


def _binary_fp32(size_claimed: int, blob: bytes) -> tuple[bytes, dict[str, str]]:
    """identity_fp32 with shape [1, 8] (32 bytes), claiming ``size_claimed`` bytes."""
    return binary_body(_fp32([1, 8], parameters={"binary_data_size": size_claimed}), blob)


def test_binary_data_size_larger_than_body(server: ServerProcess) -> None:
    body, headers = _binary_fp32(40, b"\x00" * 32)
    assert _refused(post_json(server, "identity_fp32", body, headers)) == (
        "unexpected size for input 'INPUT0', expecting 40 additional bytes for model "
        "'identity_fp32'"
    )


def test_binary_data_size_not_matching_shape(server: ServerProcess) -> None:
    body, headers = _binary_fp32(28, b"\x00" * 28)
    assert _refused(post_json(server, "identity_fp32", body, headers)) == NO_ID + (
        "input byte size mismatch for input 'INPUT0' for model 'identity_fp32'. Expected 32, got 28"
    )


def test_trailing_bytes(server: ServerProcess) -> None:
    body, headers = _binary_fp32(32, b"\x00" * 36)
    assert _refused(post_json(server, "identity_fp32", body, headers)) == (
        "unexpected additional input data for model 'identity_fp32': 4 bytes after the last "
        "binary input"
    )


def test_trailing_bytes_after_json_only_header(server: ServerProcess) -> None:
    text = json.dumps(_fp32([1, 2], [1.0, 2.0])).encode()
    headers = {"Inference-Header-Content-Length": str(len(text))}
    _refused(post_json(server, "identity_fp32", text + b"junk", headers))


def test_binary_input_without_header(server: ServerProcess) -> None:
    header = _fp32([1, 8], parameters={"binary_data_size": 32})
    assert _refused(post_json(server, "identity_fp32", header)) == (
        "must specify valid 'Infer-Header-Content-Length' in request header and "
        "'binary_data_size' when passing inputs in binary data format"
    )


_OF_INPUT = "inference input 'INPUT0' for model 'dt_bytes'"


@pytest.mark.parametrize(
    ("blob", "message"),
    [
        (
            serialize_bytes([b"ab"])[:5],
            f"BYTES element 0 of {_OF_INPUT} claims 2 bytes but only 1 remain",
        ),
        (b"\x05\x00\x00\x00ab", f"BYTES element 0 of {_OF_INPUT} claims 5 bytes but only 2 remain"),
        (
            serialize_bytes([b"a", b"b", b"c"]),
            f"unexpected number of string elements 3 for {_OF_INPUT}, expecting 2",
        ),
        (serialize_bytes([b"a"]), f"expected 2 string elements for {_OF_INPUT}, got 1"),
        (b"\x01\x00", f"unexpected end of BYTES data for {_OF_INPUT}"),
    ],
    ids=["truncated-element", "length-beyond-end", "too-many", "too-few", "short-prefix"],
)
def test_malformed_binary_bytes(server: ServerProcess, blob: bytes, message: str) -> None:
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "BYTES",
                "shape": [1, 2],
                "parameters": {"binary_data_size": len(blob)},
            }
        ]
    }
    body, headers = binary_body(header, blob)
    assert _refused(post_json(server, "dt_bytes", body, headers)) == message


@pytest.mark.parametrize("value", ["abc", "-5", "1.5", "", "12abc"])
def test_header_length_junk(server: ServerProcess, value: str) -> None:
    body = json.dumps(_fp32([1, 2], [1.0, 2.0])).encode()
    headers = {"Inference-Header-Content-Length": value}
    message = _refused(post_json(server, "identity_fp32", body, headers))
    assert message.startswith("Unable to parse Inference-Header-Content-Length, got:")


@pytest.mark.parametrize("value", ["99999999999", "18446744073709551617", "1000"])
def test_header_length_too_large(server: ServerProcess, value: str) -> None:
    body = json.dumps(_fp32([1, 2], [1.0, 2.0])).encode()
    message = _refused(
        post_json(server, "identity_fp32", body, {"Inference-Header-Content-Length": value})
    )
    # Triton's text: the header must fit in the body that came
    assert message == f"inference header size should be in range (0, {len(body)}), got: {value}"


def test_header_length_cutting_the_json(server: ServerProcess) -> None:
    body = json.dumps(_fp32([1, 2], [1.0, 2.0])).encode()
    headers = {"Inference-Header-Content-Length": "10"}
    message = _refused(post_json(server, "identity_fp32", body, headers))
    # the first 10 bytes are read as the whole JSON header, which ends too early
    assert message.startswith("failed to parse the inference request JSON: ")


def test_raw_request_not_whole_elements(server: ServerProcess) -> None:
    _refused(post_json(server, "identity_fp32", b"abc", {"Inference-Header-Content-Length": "0"}))


def test_raw_request_wrong_size_for_fixed_shape(server: ServerProcess) -> None:
    _refused(
        post_json(server, "nobatch_fp32", b"\x00" * 12, {"Inference-Header-Content-Length": "0"})
    )


# --- parameters, inputs, outputs --------------------------------------------------------------


@pytest.mark.parametrize("key", ["triton_enable_empty_final_response", "triton_x", "triton_"])
def test_triton_request_parameter(server: ServerProcess, key: str) -> None:
    body = simple_request(parameters={key: True})
    assert _refused(post_json(server, "simple", body)) == (
        "parameter keys starting with 'triton_' are reserved for Triton usage and should not "
        "be specified."
    )


def test_unknown_input(server: ServerProcess) -> None:
    body = simple_request()
    body["inputs"].append(json_input("INPUT2", "INT32", [1, 16], [0] * 16))
    message = _refused(post_json(server, "simple", body))
    assert message == "unexpected inference input 'INPUT2' for model 'simple'"


def test_missing_input(server: ServerProcess) -> None:
    body = simple_request()
    del body["inputs"][1]
    message = _refused(post_json(server, "simple", body))
    assert message.startswith(NO_ID + "expected 2 inputs but got 1 inputs for model 'simple'")
    assert "INPUT1" in message


def test_no_inputs(server: ServerProcess) -> None:
    message = _refused(post_json(server, "simple", {"inputs": []}))
    assert message.startswith(NO_ID + "expected 2 inputs but got 0 inputs for model 'simple'")


def test_duplicate_input(server: ServerProcess) -> None:
    body = simple_request()
    body["inputs"][1]["name"] = "INPUT0"
    body["id"] = "twice"
    assert _refused(post_json(server, "simple", body)) == (
        "[request id: twice] input 'INPUT0' already exists in request"
    )


def test_wrong_datatype(server: ServerProcess) -> None:
    body = simple_request()
    body["inputs"][0]["datatype"] = "INT64"
    assert _refused(post_json(server, "simple", body)) == NO_ID + (
        "inference input 'INPUT0' data-type is 'INT64', but model 'simple' expects 'INT32'"
    )


def test_duplicate_outputs(server: ServerProcess) -> None:
    body = simple_request(outputs=[{"name": "OUTPUT0"}, {"name": "OUTPUT0"}])
    assert _refused(post_json(server, "simple", body)) == NO_ID + (
        "output 'OUTPUT0' already exists in request"
    )


def test_unknown_output(server: ServerProcess) -> None:
    body = simple_request(outputs=[{"name": "OUTPUT7"}])
    assert _refused(post_json(server, "simple", body)) == (
        "unexpected inference output 'OUTPUT7' for model 'simple'"
    )


# --- JSON depth -------------------------------------------------------------------------------


DEPTH_MESSAGE = "JSON nesting depth exceeds maximum allowed limit (100)"


def _nested(depth: int, leaf: bytes) -> bytes:
    return b"[" * depth + leaf + b"]" * depth


@pytest.mark.parametrize(("datatype", "leaf"), [("INT64", b"1"), ("BYTES", b'"s"')])
def test_json_depth_in_data(server: ServerProcess, datatype: str, leaf: bytes) -> None:
    model = f"dt_{datatype.lower()}"

    def body(depth: int) -> bytes:
        return (
            b'{"inputs":[{"name":"INPUT0","datatype":"'
            + datatype.encode()
            + b'","shape":[1,1],"data":'
            + _nested(depth, leaf)
            + b"}]}"
        )

    status, _, ok = post_json(server, model, body(50))
    assert status == 200, ok
    assert _refused(post_json(server, model, body(120))) == DEPTH_MESSAGE


@pytest.mark.parametrize("depth", [2000, 200000])
def test_json_depth_very_deep_data(server: ServerProcess, depth: int) -> None:
    body = (
        b'{"inputs":[{"name":"INPUT0","datatype":"INT64","shape":[1,1],"data":'
        + _nested(depth, b"1")
        + b"}]}"
    )
    assert _refused(post_json(server, "dt_int64", body)) == DEPTH_MESSAGE


@pytest.mark.parametrize("where", ["request-parameters", "input-parameters"])
def test_very_deep_parameters(server: ServerProcess, where: str) -> None:
    """A parameter value nested 200000 deep is a 400 (parameter values are scalars), never a
    crash. (Triton's depth limit covers ``data`` only: its parser takes deeper documents.)"""
    depth = 200000
    deep = b'{"a":' * depth + b"1" + b"}" * depth
    good = b'{"name":"INPUT0","datatype":"INT64","shape":[1,1],"data":[1]'
    if where == "request-parameters":
        body = b'{"inputs":[' + good + b'}],"parameters":{"x":' + deep + b"}}"
    else:
        body = b'{"inputs":[' + good + b',"parameters":{"x":' + deep + b"}}]}"
    _refused(post_json(server, "dt_int64", body))


# --- chunk count ------------------------------------------------------------------------------


def test_many_tiny_chunks_are_answered(server: ServerProcess) -> None:
    """65537 one-byte chunks: Tornado coalesces them before they reach the handler, so the
    per-chunk cost is bounded without Triton's chunk-count refusal; the (whitespace) body is
    then refused as JSON with a clean 400."""
    assert server.port is not None
    chunks = b"1\r\n \r\n" * 65537 + b"0\r\n\r\n"
    head = (
        b"POST /v2/models/identity_fp32/infer HTTP/1.1\r\nHost: x\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    response = parse_raw_response(raw_exchange(server, head + chunks, timeout=30))
    assert _refused(response).startswith("failed to parse the inference request JSON")


# --- size limits: a server started with --http-max-input-size=1024 -----------------------------


@pytest.fixture(scope="module")
def small_server() -> Iterator[ServerProcess]:
    process = start_server(EXAMPLES, args=(f"--http-max-input-size={LIMIT}",))
    assert process.port is not None, process.log
    yield process
    process.stop()


@pytest.fixture
def small(small_server: ServerProcess) -> Iterator[ServerProcess]:
    yield small_server
    assert_simple_ok(small_server)


def test_small_server_accepts_small_bodies(small: ServerProcess) -> None:
    body = json.dumps(simple_request()).encode()
    assert len(body) < LIMIT
    assert post_json(small, "simple", body)[0] == 200


def test_oversize_content_length_refused_before_body(small: ServerProcess) -> None:
    """Only the headers are sent; the answer must come without the body."""
    assert small.port is not None
    head = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n"
    with socket.create_connection(("127.0.0.1", small.port), timeout=10) as sock:
        sock.sendall(head)
        started = time.monotonic()
        response = parse_raw_response(read_response(sock))
        assert time.monotonic() - started < 5
    assert _refused(response) == (
        f"request JSON size of 100000 bytes exceeds the maximum allowed input size of {LIMIT} "
        "bytes. Use --http-max-input-size to increase the limit."
    )


def test_oversize_binary_content_length(small: ServerProcess) -> None:
    assert small.port is not None
    head = (
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5000\r\n"
        b"Inference-Header-Content-Length: 100\r\n\r\n"
    )
    with socket.create_connection(("127.0.0.1", small.port), timeout=10) as sock:
        sock.sendall(head)
        response = parse_raw_response(read_response(sock))
    assert "exceeds the maximum allowed" in _refused(response)


def test_oversize_body_not_read_as_requests(small: ServerProcess) -> None:
    """After an early refusal, the unread body must not be parsed as further requests."""
    inner = b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n"
    body = inner * (2 * LIMIT // len(inner))
    head = b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n"
    assert small.port is not None
    with socket.create_connection(("127.0.0.1", small.port), timeout=10) as sock:
        sock.sendall(head % len(body) + body)
        data = b""
        sock.settimeout(1.0)
        try:
            while chunk := sock.recv(65536):
                data += chunk
        except (TimeoutError, ConnectionResetError):
            pass
    assert data.count(b"HTTP/1.1 ") == 1, data
    assert _refused(parse_raw_response(data)).startswith("request JSON size of")


def test_oversize_plain_body(small: ServerProcess) -> None:
    body = json.dumps(
        {"inputs": [json_input("INPUT0", "INT32", [1, 16], [0] * 16)], "pad": "x" * 2000}
    ).encode()
    assert "exceeds the maximum allowed" in _refused(post_json(small, "simple", body))


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compression_bomb(small: ServerProcess, encoding: str) -> None:
    plain = b'{"inputs":[],"pad":"' + b" " * 300000 + b'"}'
    packed = gzip.compress(plain) if encoding == "gzip" else zlib.compress(plain, 9)
    assert len(packed) < LIMIT  # the compressed body itself passes the limit
    message = _refused(post_json(small, "simple", packed, {"Content-Encoding": encoding}))
    assert "exceeds the maximum allowed input size" in message


def test_oversize_chunked_body(small: ServerProcess) -> None:
    chunks = [b" " * 300] * 10
    response = chunked_request(small, "/v2/models/simple/infer", chunks)
    assert "exceeds the maximum allowed" in _refused(response)


def test_corrupt_compressed_body(small: ServerProcess) -> None:
    as_gzip = {"Content-Encoding": "gzip"}
    # a gzip header whose deflate stream stops after one byte
    assert _refused(post_json(small, "simple", b"\x1f\x8b\x08\x00garbage", as_gzip)) == (
        "truncated gzip request body"
    )
    truncated = gzip.compress(json.dumps(simple_request()).encode())[:-10]
    assert _refused(post_json(small, "simple", truncated, as_gzip)) == (
        "truncated gzip request body"
    )
    # a deflate block of the reserved type 3, neither gzip/zlib nor raw deflate
    invalid = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\x03" + b"\xff" * 4
    assert _refused(post_json(small, "simple", invalid, as_gzip)) == (
        "unable to decompress the gzip request body"
    )
    assert _refused(post_json(small, "simple", b"\xff" * 4, {"Content-Encoding": "deflate"})) == (
        "unable to decompress the deflate request body"
    )


def test_oversize_body_sent_whole_gets_the_answer_and_keeps_the_connection(
    small: ServerProcess,
) -> None:
    """A plain client that sends the whole oversize body (as `requests` does) reads the 400
    rather than a connection reset, and can go on using the connection."""
    assert small.port is not None
    connection = http.client.HTTPConnection("127.0.0.1", small.port, timeout=10)
    try:
        connection.request("POST", "/v2/models/simple/infer", b"x" * (LIMIT * 100))
        response = connection.getresponse()
        body = response.read()
        assert response.status == 400
        assert b"exceeds the maximum allowed input size" in body
        sock = connection.sock  # http.client would reconnect silently: it must stay the same
        connection.request("GET", "/v2/health/live")
        again = connection.getresponse()
        again.read()
        assert again.status == 200
        assert connection.sock is sock and sock is not None, "the connection was not kept"
    finally:
        connection.close()
