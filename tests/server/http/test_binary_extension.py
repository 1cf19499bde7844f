"""The binary tensor data extension on the wire, with raw HTTP requests
(triton-facts §1.4, §7.1, §7.2)."""

from __future__ import annotations

import gzip
import http.client
import json
import socket
import zlib
from collections.abc import Callable
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from tests.server.http.helpers import (
    SIMPLE_A,
    SIMPLE_B,
    SIMPLE_DIFF,
    SIMPLE_SUM,
    binary_body,
    chunked_request,
    error_of,
    json_input,
    parse_raw_response,
    post_json,
    read_response,
    serialize_bytes,
    simple_request,
    split_binary,
)
from tests.server_process import ServerProcess

SUM_BYTES = np.array(SIMPLE_SUM, dtype="<i4").tobytes()
DIFF_BYTES = np.array(SIMPLE_DIFF, dtype="<i4").tobytes()
A_BYTES = np.array(SIMPLE_A, dtype="<i4").tobytes()
B_BYTES = np.array(SIMPLE_B, dtype="<i4").tobytes()


def _binary_simple_header(**extra: Any) -> dict[str, Any]:
    return {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "INT32",
                "shape": [1, 16],
                "parameters": {"binary_data_size": 64},
            },
            {
                "name": "INPUT1",
                "datatype": "INT32",
                "shape": [1, 16],
                "parameters": {"binary_data_size": 64},
            },
        ],
        **extra,
    }


def _assert_json_simple(response: tuple[int, dict[str, str], bytes]) -> dict[str, Any]:
    status, headers, body = response
    assert status == 200, body
    assert headers["Content-Type"] == "application/json"
    assert "Inference-Header-Content-Length" not in headers
    parsed: dict[str, Any] = json.loads(body)
    assert {o["name"]: o["data"] for o in parsed["outputs"]} == {
        "OUTPUT0": SIMPLE_SUM,
        "OUTPUT1": SIMPLE_DIFF,
    }
    return parsed


# --- JSON-only bodies, Content-Type ---------------------------------------------------------


def test_json_body_without_header(server: ServerProcess) -> None:
    _assert_json_simple(post_json(server, "simple", simple_request()))


def test_json_body_with_header_equal_to_body_length(server: ServerProcess) -> None:
    """perf_analyzer sends Inference-Header-Content-Length = whole body on JSON requests,
    plus an empty Expect and a JSON Content-Type."""
    body = json.dumps(simple_request()).encode()
    headers = {
        "Inference-Header-Content-Length": str(len(body)),
        "Content-Type": "application/json",
        "Expect": "",
    }
    _assert_json_simple(post_json(server, "simple", body, headers))


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "application/json",
        "application/octet-stream",
        "application/x-www-form-urlencoded",
        "text/plain; charset=utf-8",
    ],
)
def test_content_type_ignored(server: ServerProcess, content_type: str | None) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    _assert_json_simple(post_json(server, "simple", simple_request(), headers))
    body, binary_headers = binary_body(_binary_simple_header(), A_BYTES, B_BYTES)
    status, _, response = post_json(server, "simple", body, {**headers, **binary_headers})
    assert status == 200, response
    assert {o["name"]: o["data"] for o in json.loads(response)["outputs"]}["OUTPUT0"] == SIMPLE_SUM


# --- binary inputs ----------------------------------------------------------------------------


def test_binary_inputs_in_input_order(server: ServerProcess) -> None:
    # INPUT1 listed first: the first blob belongs to INPUT1.
    header = _binary_simple_header()
    header["inputs"].reverse()
    body, headers = binary_body(header, B_BYTES, A_BYTES)
    _assert_json_simple(post_json(server, "simple", body, headers))


def test_mixed_binary_and_json_inputs(server: ServerProcess) -> None:
    header = {
        "inputs": [
            json_input("INPUT0", "INT32", [1, 16], SIMPLE_A),
            {
                "name": "INPUT1",
                "datatype": "INT32",
                "shape": [1, 16],
                "parameters": {"binary_data_size": 64},
            },
        ]
    }
    body, headers = binary_body(header, B_BYTES)
    _assert_json_simple(post_json(server, "simple", body, headers))


def test_binary_data_size_zero_is_an_empty_tensor(server: ServerProcess) -> None:
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [1, 0],
                "parameters": {"binary_data_size": 0},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    body, headers = binary_body(header)
    response = post_json(server, "identity_fp32", body, headers)
    assert response[0] == 200, response[2]
    parsed, tail = split_binary(response)
    assert parsed["outputs"][0]["shape"] == [1, 0]
    assert parsed["outputs"][0]["parameters"] == {"binary_data_size": 0}
    assert tail == b""


# --- binary outputs ---------------------------------------------------------------------------


def test_binary_output_framing(server: ServerProcess) -> None:
    body, headers = binary_body(_binary_simple_header(), A_BYTES, B_BYTES)
    # No 'outputs' and no binary_data_output: JSON is the default.
    _assert_json_simple(post_json(server, "simple", body, headers))

    body, headers = binary_body(
        _binary_simple_header(parameters={"binary_data_output": True}), A_BYTES, B_BYTES
    )
    response = post_json(server, "simple", body, headers)
    status, response_headers, raw = response
    assert status == 200, raw
    assert response_headers["Content-Type"] == "application/octet-stream"
    length = int(response_headers["Inference-Header-Content-Length"])
    assert int(response_headers["Content-Length"]) == len(raw) == length + 128
    parsed = json.loads(raw[:length])  # exactly the JSON: no trailing or missing byte
    assert parsed["model_name"] == "simple" and parsed["model_version"] == "1"
    assert parsed["outputs"] == [
        {
            "name": "OUTPUT0",
            "datatype": "INT32",
            "shape": [1, 16],
            "parameters": {"binary_data_size": 64},
        },
        {
            "name": "OUTPUT1",
            "datatype": "INT32",
            "shape": [1, 16],
            "parameters": {"binary_data_size": 64},
        },
    ]
    assert raw[length:] == SUM_BYTES + DIFF_BYTES


def test_binary_blobs_in_requested_output_order(server: ServerProcess) -> None:
    request = simple_request(
        outputs=[
            {"name": "OUTPUT1", "parameters": {"binary_data": True}},
            {"name": "OUTPUT0", "parameters": {"binary_data": True}},
        ]
    )
    response = post_json(server, "simple", request)
    parsed, tail = split_binary(response)
    assert [o["name"] for o in parsed["outputs"]] == ["OUTPUT1", "OUTPUT0"]
    assert tail == DIFF_BYTES + SUM_BYTES


def _flag(value: bool | None) -> dict[str, Any]:
    return {} if value is None else {"parameters": {"binary_data": value}}


# (request binary_data_output, outputs [(name, binary_data)] or None) -> binary outputs
OVERRIDES = [
    pytest.param(
        None, [("OUTPUT0", True), ("OUTPUT1", False)], {"OUTPUT0"}, id="out0-true-out1-false"
    ),
    pytest.param(
        None, [("OUTPUT0", True), ("OUTPUT1", None)], {"OUTPUT0"}, id="out0-true-out1-omitted"
    ),
    pytest.param(None, [("OUTPUT0", False), ("OUTPUT1", None)], set(), id="explicit-false"),
    pytest.param(None, None, set(), id="default-json"),
    pytest.param(True, None, {"OUTPUT0", "OUTPUT1"}, id="request-true"),
    pytest.param(
        True, [("OUTPUT0", False), ("OUTPUT1", None)], {"OUTPUT1"}, id="request-true-out0-false"
    ),
    pytest.param(
        True, [("OUTPUT0", False), ("OUTPUT1", False)], set(), id="request-true-both-false"
    ),
    pytest.param(
        False, [("OUTPUT0", True), ("OUTPUT1", None)], {"OUTPUT0"}, id="request-false-out0-true"
    ),
    pytest.param(False, None, set(), id="request-false"),
]


@pytest.mark.parametrize(("request_flag", "outputs", "binary"), OVERRIDES)
def test_binary_data_overrides(
    server: ServerProcess,
    request_flag: bool | None,
    outputs: list[tuple[str, bool | None]] | None,
    binary: set[str],
) -> None:
    """Per-output ``binary_data`` wins over request ``binary_data_output``, both ways;
    the request flag covers every output without its own flag (DESIGN.md)."""
    extra: dict[str, Any] = {}
    if request_flag is not None:
        extra["parameters"] = {"binary_data_output": request_flag}
    if outputs is not None:
        extra["outputs"] = [{"name": name, **_flag(flag)} for name, flag in outputs]
    status, headers, body = post_json(server, "simple", simple_request(**extra))
    assert status == 200, body
    expected_bytes = {"OUTPUT0": SUM_BYTES, "OUTPUT1": DIFF_BYTES}
    expected_data = {"OUTPUT0": SIMPLE_SUM, "OUTPUT1": SIMPLE_DIFF}
    if not binary:
        assert headers["Content-Type"] == "application/json"
        assert "Inference-Header-Content-Length" not in headers
        parsed, tail = json.loads(body), b""
    else:
        assert headers["Content-Type"] == "application/octet-stream"
        parsed, tail = split_binary((status, headers, body))
    offset = 0
    for output in parsed["outputs"]:
        name = output["name"]
        if name in binary:
            assert "data" not in output
            size = output["parameters"]["binary_data_size"]
            assert tail[offset : offset + size] == expected_bytes[name]
            offset += size
        else:
            assert "parameters" not in output or "binary_data_size" not in output["parameters"]
            assert output["data"] == expected_data[name]
    assert offset == len(tail)
    assert {o["name"] for o in parsed["outputs"]} == {
        name for name, _ in (outputs or [("OUTPUT0", None), ("OUTPUT1", None)])
    }


# --- raw binary requests (Inference-Header-Content-Length: 0) ---------------------------------


@pytest.mark.parametrize("count", [8, 32])
def test_raw_request_identity(server: ServerProcess, count: int) -> None:
    data = np.random.default_rng(count).standard_normal(count).astype("<f4").tobytes()
    response = post_json(server, "identity_fp32", data, {"Inference-Header-Content-Length": "0"})
    assert response[0] == 200, response[2]
    assert response[1]["Content-Type"] == "application/octet-stream"
    parsed, tail = split_binary(response)
    assert parsed["outputs"] == [
        {
            "name": "OUTPUT0",
            "datatype": "FP32",
            "shape": [1, count],
            "parameters": {"binary_data_size": 4 * count},
        }
    ]
    assert tail == data


def test_raw_request_non_batching_model(server: ServerProcess) -> None:
    data = np.arange(8, dtype="<f4").tobytes()
    response = post_json(server, "nobatch_fp32", data, {"Inference-Header-Content-Length": "0"})
    parsed, tail = split_binary(response)
    assert parsed["outputs"][0]["shape"] == [8]
    assert tail == data


def test_raw_request_bytes_shape_one(server: ServerProcess) -> None:
    response = post_json(server, "bytes_one", b"427", {"Inference-Header-Content-Length": "0"})
    assert response[0] == 200, response[2]
    parsed, tail = split_binary(response)
    assert parsed["outputs"] == [
        {
            "name": "OUTPUT0",
            "datatype": "BYTES",
            "shape": [1, 1],
            "parameters": {"binary_data_size": 7},
        }
    ]
    assert tail == b"\x03\x00\x00\x00427"


RAW_REFUSALS = [
    pytest.param(
        "simple",
        b"\x00" * 128,
        "[request id: <id_unknown>] Raw request must only have 1 input (found 1) to be "
        "deduced but got 2 inputs in 'simple' model configuration",
        id="two-inputs",
    ),
    pytest.param(
        "two_var_fp16",
        b"\x00" * 8,
        "[request id: <id_unknown>] The shape of the raw input 'INPUT0' can not be deduced "
        "because there are more than one variable-sized dimension",
        id="two-variable-dims",
    ),
    pytest.param(
        "identity_bytes",
        b"427",
        "[request id: <id_unknown>] For BYTE datatype raw input 'INPUT0', the model must "
        "have input shape [1]",
        id="bytes-not-shape-one",
    ),
]


@pytest.mark.parametrize(("model", "body", "message"), RAW_REFUSALS)
def test_raw_request_refusals(
    server: ServerProcess, assert_still_serving: None, model: str, body: bytes, message: str
) -> None:
    response = post_json(server, model, body, {"Inference-Header-Content-Length": "0"})
    assert response[0] == 400
    assert error_of(response) == message


# --- chunked request bodies -------------------------------------------------------------------


def _pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


def test_chunked_json_body(server: ServerProcess) -> None:
    body = json.dumps(simple_request()).encode()
    chunks = _pieces(body, 13)
    assert len(chunks) > 5
    _assert_json_simple(chunked_request(server, "/v2/models/simple/infer", chunks))


def test_chunked_binary_body(server: ServerProcess) -> None:
    """Chunk boundaries cut through the JSON header and through the blobs."""
    body, headers = binary_body(
        _binary_simple_header(parameters={"binary_data_output": True}), A_BYTES, B_BYTES
    )
    response = chunked_request(server, "/v2/models/simple/infer", _pieces(body, 37), headers)
    assert response[0] == 200, response[2]
    _, tail = split_binary(response)
    assert tail == SUM_BYTES + DIFF_BYTES


def test_chunked_raw_request_single_chunk(server: ServerProcess) -> None:
    data = np.arange(8, dtype="<f4").tobytes()
    response = chunked_request(
        server, "/v2/models/identity_fp32/infer", [data], {"Inference-Header-Content-Length": "0"}
    )
    assert response[0] == 200, response[2]
    assert split_binary(response)[1] == data


def test_chunked_body_larger_than_first_buffer(server: ServerProcess) -> None:
    """A chunked body beyond the receiver's first buffer (64 KiB) grows it intact."""
    values = np.arange(4 * 40000, dtype="<f4")
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [4, 40000],
                "parameters": {"binary_data_size": values.nbytes},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    body, headers = binary_body(header, values.tobytes())
    response = chunked_request(
        server, "/v2/models/identity_fp32/infer", _pieces(body, 50000), headers
    )
    assert response[0] == 200, response[2]
    assert split_binary(response)[1] == values.tobytes()


# --- compression ------------------------------------------------------------------------------


COMPRESSORS: dict[str, Callable[[bytes], bytes]] = {
    "gzip": lambda data: gzip.compress(data),
    "deflate": lambda data: zlib.compress(data),
}


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "GZIP"])
def test_compressed_json_request(server: ServerProcess, encoding: str) -> None:
    body = COMPRESSORS[encoding.lower()](json.dumps(simple_request()).encode())
    _assert_json_simple(post_json(server, "simple", body, {"Content-Encoding": encoding}))


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_compressed_binary_request(server: ServerProcess, encoding: str) -> None:
    """Inference-Header-Content-Length counts the decompressed JSON."""
    body, headers = binary_body(
        _binary_simple_header(parameters={"binary_data_output": True}), A_BYTES, B_BYTES
    )
    headers["Content-Encoding"] = encoding
    response = post_json(server, "simple", COMPRESSORS[encoding](body), headers)
    assert response[0] == 200, response[2]
    assert split_binary(response)[1] == SUM_BYTES + DIFF_BYTES


def test_identity_content_encoding_accepted(server: ServerProcess) -> None:
    _assert_json_simple(
        post_json(server, "simple", simple_request(), {"Content-Encoding": "identity"})
    )


@pytest.mark.parametrize("encoding", ["br", "compress"])
def test_unknown_content_encoding(
    server: ServerProcess, assert_still_serving: None, encoding: str
) -> None:
    response = post_json(server, "simple", simple_request(), {"Content-Encoding": encoding})
    assert response[0] == 501
    assert error_of(response) == "Unsupported compression type"
    assert response[1].get("Accept-Encoding") == "gzip, deflate", response[1]


@pytest.mark.parametrize(
    ("accept", "expected"),
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip;q=0.2, deflate;q=0.9", "deflate"),
        ("gzip;q=0, deflate", "deflate"),
        ("identity", None),
        ("br", None),
    ],
)
def test_response_compression_json(
    server: ServerProcess, accept: str, expected: str | None
) -> None:
    status, headers, body = post_json(
        server, "simple", simple_request(), {"Accept-Encoding": accept}
    )
    assert status == 200, body
    assert headers.get("Content-Encoding") == expected
    if expected == "gzip":
        body = gzip.decompress(body)
    elif expected == "deflate":
        body = zlib.decompress(body)
    _assert_json_simple((status, {"Content-Type": headers["Content-Type"]}, body))


def test_response_compression_binary(server: ServerProcess) -> None:
    request = simple_request(parameters={"binary_data_output": True})
    status, headers, body = post_json(server, "simple", request, {"Accept-Encoding": "gzip"})
    assert status == 200, body
    assert headers["Content-Encoding"] == "gzip"
    assert headers["Content-Type"] == "application/octet-stream"
    plain = gzip.decompress(body)
    length = int(headers["Inference-Header-Content-Length"])  # of the uncompressed JSON
    parsed = json.loads(plain[:length])
    assert [o["parameters"]["binary_data_size"] for o in parsed["outputs"]] == [64, 64]
    assert plain[length:] == SUM_BYTES + DIFF_BYTES


# --- datatypes on the wire --------------------------------------------------------------------


def test_bytes_binary_encoding(server: ServerProcess) -> None:
    elements = [b"", b"a", b"\x00\x00", "\u00e9\u6f22".encode(), b"\xff\xfe\xfd", b"z" * 70000]
    blob = serialize_bytes(elements)
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "BYTES",
                "shape": [2, 3],
                "parameters": {"binary_data_size": len(blob)},
            }
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    body, headers = binary_body(header, blob)
    response = post_json(server, "dt_bytes", body, headers)
    assert response[0] == 200, response[2]
    parsed, tail = split_binary(response)
    assert parsed["outputs"] == [
        {
            "name": "OUTPUT0",
            "datatype": "BYTES",
            "shape": [2, 3],
            "parameters": {"binary_data_size": len(blob)},
        }
    ]
    assert tail == blob


def test_bytes_json_output_is_strings(server: ServerProcess) -> None:
    request = {"inputs": [json_input("INPUT0", "BYTES", [1, 3], ["", "\u00e9", "a\u0000b"])]}
    status, _, body = post_json(server, "dt_bytes", request)
    assert status == 200, body
    assert json.loads(body)["outputs"][0]["data"] == ["", "\u00e9", "a\u0000b"]


def test_bool_is_one_byte(server: ServerProcess) -> None:
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "BOOL",
                "shape": [1, 3],
                "parameters": {"binary_data_size": 3},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    body, headers = binary_body(header, b"\x01\x00\x01")
    response = post_json(server, "dt_bool", body, headers)
    assert response[0] == 200, response[2]
    parsed, tail = split_binary(response)
    assert parsed["outputs"][0]["parameters"] == {"binary_data_size": 3}
    assert tail == b"\x01\x00\x01"
    # The same input, JSON out.
    header["parameters"] = {"binary_data_output": False}
    body, headers = binary_body(header, b"\x01\x00\x01")
    status, _, raw = post_json(server, "dt_bool", body, headers)
    assert status == 200, raw
    assert json.loads(raw)["outputs"][0]["data"] == [True, False, True]


def test_fp16_little_endian_bytes(server: ServerProcess) -> None:
    values = np.array([1.0, -2.5, 65504.0, np.inf, -0.0, 6e-8], dtype="<f2")
    header = {
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP16",
                "shape": [1, 6],
                "parameters": {"binary_data_size": 12},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    body, headers = binary_body(header, values.tobytes())
    response = post_json(server, "dt_fp16", body, headers)
    assert response[0] == 200, response[2]
    assert split_binary(response)[1] == values.tobytes()


def test_bytes_invalid_utf8_to_json_is_replaced(server: ServerProcess) -> None:
    """JSON strings cannot carry invalid UTF-8: such bytes come back as U+FFFD (documented
    in server/protocol/json_codec.py); the binary format returns them exactly."""
    blob = serialize_bytes([b"ok", b"a\xffb"])
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
    status, _, raw = post_json(server, "dt_bytes", body, headers)
    assert status == 200, raw
    assert json.loads(raw)["outputs"][0]["data"] == ["ok", "a\ufffdb"]


# --- output selection and HTTP details ----------------------------------------------------------


def test_empty_outputs_list_means_every_output(server: ServerProcess) -> None:
    """Triton's core treats an empty requested-output list as "all outputs" (as when
    ``outputs`` is absent; gRPC cannot tell the two apart)."""
    _assert_json_simple(post_json(server, "simple", simple_request(outputs=[])))


def test_expect_100_continue(server: ServerProcess) -> None:
    body = json.dumps(simple_request()).encode()
    head = (
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n"
        b"Content-Length: %d\r\nExpect: 100-continue\r\n\r\n" % len(body)
    )
    assert server.port is not None
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(head)
        interim = sock.recv(1024)
        assert interim.startswith(b"HTTP/1.1 100"), interim
        sock.sendall(body)
        response = parse_raw_response(read_response(sock))
    _assert_json_simple(response)


def test_keep_alive_after_refusal(server: ServerProcess) -> None:
    """A refused request leaves the connection usable for the next one."""
    assert server.port is not None
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request("POST", "/v2/models/simple/infer", body=b"{bad")
        refused = conn.getresponse()
        assert refused.status == 400 and b"failed to parse" in refused.read()
        assert refused.getheader("Connection") != "close"
        sock = conn.sock  # http.client would reconnect silently: the socket must stay the same
        conn.request("POST", "/v2/models/simple/infer", body=json.dumps(simple_request()))
        response = conn.getresponse()
        results = (response.status, dict(response.getheaders()), response.read())
        assert conn.sock is sock and sock is not None, "the connection was not kept"
        _assert_json_simple(results)
    finally:
        conn.close()


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_precision_json_input_is_accepted(server: ServerProcess, datatype: str) -> None:
    """Unlike Triton, FP16 and BF16 are taken in JSON too (tritonclient refuses BF16 JSON
    client-side, so this goes raw); values round to the nearest representable number."""
    dtype = np.float16 if datatype == "FP16" else ml_dtypes.bfloat16
    values = [1.5, -2.0, 0.1, 65504.0 if datatype == "FP16" else 3.0e38]
    body = {
        "inputs": [json_input("INPUT0", datatype, [1, 4], values)],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
    }
    header, blob = split_binary(post_json(server, f"dt_{datatype.lower()}", body))
    assert header["outputs"][0]["datatype"] == datatype
    np.testing.assert_array_equal(
        np.frombuffer(blob, dtype=dtype), np.array(values, dtype=np.float64).astype(dtype)
    )
