"""The pre-encoded requests are what the server's own codecs decode to the same tensors, and
the response checks tell a success from a refusal."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import orjson

from server.generated import grpc_service_pb2 as pb
from server.loadtest.encoding import (
    check_grpc_response,
    check_http_response,
    grpc_infer_request,
    http_infer_request,
    model_path,
)
from server.loadtest.inputs import Tensor
from server.protocol import datatypes, grpc_codec, rest_codec


def _tensors() -> list[Tensor]:
    text = np.empty((1, 3), dtype=object)
    text[0] = [b"a", b"\xff\x00", b"longer text"]
    return [
        Tensor("I", datatypes.from_name("INT32"), np.arange(6, dtype=np.int32).reshape(2, 3)),
        Tensor("H", datatypes.from_name("FP16"), np.array([[0.5, 2.0]], dtype=np.float16)),
        Tensor("B", datatypes.from_name("BF16"), np.array([1.5, -3.0], dtype=ml_dtypes.bfloat16)),
        Tensor("T", datatypes.from_name("BYTES"), text),
        Tensor("F", datatypes.from_name("BOOL"), np.array([True, False])),
    ]


def _split_http(raw: bytes) -> tuple[str, dict[str, str], bytes]:
    head, _, body = raw.partition(b"\r\n\r\n")
    request_line, *lines = head.decode("latin-1").split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    assert int(headers["content-length"]) == len(body)
    return request_line, headers, body


def test_model_path() -> None:
    assert model_path("simple", "") == "/v2/models/simple"
    assert model_path("a/b", "2") == "/v2/models/a%2Fb/versions/2"


def test_http_binary_request_decodes_to_the_same_tensors() -> None:
    tensors = _tensors()
    raw = http_infer_request("h:1", "m", "3", tensors, ["OUT"], binary=True)
    request_line, headers, body = _split_http(raw)
    assert request_line == "POST /v2/models/m/versions/3/infer HTTP/1.1"
    assert headers["host"] == "h:1"
    assert headers["content-type"] == "application/octet-stream"
    length = int(headers["inference-header-content-length"])
    header = orjson.loads(body[:length])
    assert header["outputs"] == [{"name": "OUT", "parameters": {"binary_data": True}}]
    decoded = rest_codec.decode_request(header, memoryview(body)[length:], "m", "3")
    for tensor, got in zip(tensors, decoded.inputs, strict=True):
        assert (got.name, got.datatype.name, got.shape) == (
            tensor.name,
            tensor.datatype.name,
            tensor.array.shape,
        )
        assert got.data.reshape(got.shape).tolist() == tensor.array.tolist()


def test_http_json_request_decodes_to_the_same_tensors() -> None:
    tensors = [t for t in _tensors() if t.name != "T"]  # JSON cannot carry non-UTF-8 bytes
    raw = http_infer_request("h:1", "m", "", tensors, ["OUT"], binary=False)
    request_line, headers, body = _split_http(raw)
    assert request_line == "POST /v2/models/m/infer HTTP/1.1"
    assert headers["content-type"] == "application/json"
    assert "inference-header-content-length" not in headers
    decoded = rest_codec.decode_request(orjson.loads(body), memoryview(b""), "m", "")
    for tensor, got in zip(tensors, decoded.inputs, strict=True):
        assert got.data.reshape(got.shape).tolist() == tensor.array.tolist()


def test_grpc_request_decodes_to_the_same_tensors() -> None:
    tensors = _tensors()
    message = pb.ModelInferRequest.FromString(grpc_infer_request("m", "2", tensors))
    assert (message.model_name, message.model_version) == ("m", "2")
    assert len(message.raw_input_contents) == len(tensors) and not message.outputs
    decoded = grpc_codec.decode_request(message)
    for tensor, got in zip(tensors, decoded.inputs, strict=True):
        assert (got.name, got.shape) == (tensor.name, tensor.array.shape)
        assert got.data.reshape(got.shape).tolist() == tensor.array.tolist()


def _http_response(status: str, header: bytes, blob: bytes = b"") -> bytes:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(header) + len(blob)}"]
    if blob:
        lines.append(f"Inference-Header-Content-Length: {len(header)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + header + blob


def test_check_http_response() -> None:
    ok = b'{"model_name":"m","outputs":[{"name":"A","datatype":"FP32","shape":[1]}]}'
    assert check_http_response(_http_response("200 OK", ok), ["A"]) == []
    binary = ok.replace(b'"shape":[1]', b'"shape":[1],"parameters":{"binary_data_size":4}')
    assert check_http_response(_http_response("200 OK", binary, b"\0" * 4), ["A"]) == []
    assert check_http_response(_http_response("200 OK", ok), ["A", "B"]) == [
        "outputs B missing from the response"
    ]
    refused = _http_response("400 Bad Request", b'{"error":"unexpected shape"}')
    (problem,) = check_http_response(refused, ["A"])
    assert "400 Bad Request" in problem and "unexpected shape" in problem
    assert check_http_response(b"garbage", ["A"])[0].startswith("not an HTTP response")
    assert "unreadable" in check_http_response(_http_response("200 OK", b"{"), ["A"])[0]


def test_check_grpc_response() -> None:
    response = pb.ModelInferResponse(model_name="m")
    response.outputs.add(name="A", datatype="FP32", shape=[1])
    response.raw_output_contents.append(b"\0" * 4)
    assert check_grpc_response(response.SerializeToString(), ["A"]) == []
    assert check_grpc_response(response.SerializeToString(), ["A", "B"]) == [
        "outputs B missing from the response"
    ]
    response.raw_output_contents.append(b"")
    assert (
        "2 raw_output_contents for 1 outputs"
        in check_grpc_response(response.SerializeToString(), ["A"])[0]
    )
    (problem,) = check_grpc_response(b"\x0a\xff", ["A"])  # truncated: reported, not raised
    assert problem.startswith("unreadable ModelInferResponse")
