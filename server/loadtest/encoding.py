"""The one request a sweep sends, encoded once, and the check of a response to it.

HTTP: a complete HTTP/1.1 message (request line, headers, body), binary tensor data extension
by default (``binary_data_size`` inputs, outputs asked for as ``binary_data``) or all JSON.
gRPC: a serialized ``ModelInferRequest`` with ``raw_input_contents``. Both use the server's own
protocol tables, so every V2 datatype (BYTES, FP16, BF16 included) is framed the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any
from urllib.parse import quote

import orjson

from server.generated import grpc_service_pb2 as pb
from server.loadtest.clients import http_error_text
from server.loadtest.inputs import Tensor
from server.protocol.binary import tensor_to_bytes
from server.protocol.json_codec import encode_data


def model_path(model: str, version: str) -> str:
    """``/v2/models/{m}[/versions/{v}]``."""
    path = f"/v2/models/{quote(model, safe='')}"
    return f"{path}/versions/{quote(version, safe='')}" if version else path


def http_infer_request(
    host: str,
    model: str,
    version: str,
    tensors: Sequence[Tensor],
    outputs: Sequence[str],
    binary: bool,
) -> bytes:
    """The whole HTTP request; ``host`` is the ``Host`` header's value."""
    specs: list[dict[str, Any]] = []
    blobs: list[bytes] = []
    for tensor in tensors:
        spec: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype.name,
            "shape": list(tensor.array.shape),
        }
        if binary:
            blob = bytes(tensor_to_bytes(tensor.array, tensor.datatype))
            spec["parameters"] = {"binary_data_size": len(blob)}
            blobs.append(blob)
        else:
            spec["data"] = encode_data(tensor.array, tensor.datatype)
        specs.append(spec)
    document: dict[str, Any] = {"inputs": specs}
    if binary:
        document["outputs"] = [{"name": n, "parameters": {"binary_data": True}} for n in outputs]
    header = orjson.dumps(document, option=orjson.OPT_SERIALIZE_NUMPY)
    body = header + b"".join(blobs)
    lines = [f"POST {model_path(model, version)}/infer HTTP/1.1", f"Host: {host}"]
    if binary:
        lines += [
            "Content-Type: application/octet-stream",
            f"Inference-Header-Content-Length: {len(header)}",
        ]
    else:
        lines.append("Content-Type: application/json")
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def grpc_infer_request(model: str, version: str, tensors: Sequence[Tensor]) -> bytes:
    """A serialized ``ModelInferRequest``: every input in ``raw_input_contents``, all outputs
    returned (raw) by leaving ``outputs`` empty."""
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    for tensor in tensors:
        request.inputs.add(
            name=tensor.name, datatype=tensor.datatype.name, shape=list(tensor.array.shape)
        )
        request.raw_input_contents.append(bytes(tensor_to_bytes(tensor.array, tensor.datatype)))
    return request.SerializeToString()


def _missing(seen: set[str], outputs: Sequence[str]) -> list[str]:
    absent = [name for name in outputs if name not in seen]
    return [f"outputs {', '.join(absent)} missing from the response"] if absent else []


def check_http_response(raw: bytes, outputs: Sequence[str]) -> list[str]:
    """Problems with one complete HTTP response (status, header, outputs); empty when it is a
    success that carries every output."""
    head, sep, body = raw.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].split()
    if not sep or len(status) < 2:
        return [f"not an HTTP response: {raw[:100]!r}"]
    if status[1] != b"200":
        return [http_error_text(raw)]
    headers = {
        key.strip().lower(): value.strip()
        for key, _, value in (line.partition(b":") for line in head.split(b"\r\n")[1:])
    }
    length = headers.get(b"inference-header-content-length")
    try:
        document = orjson.loads(body[: int(length)] if length is not None else body)
        names = {output["name"] for output in document["outputs"]}
    except (ValueError, KeyError, TypeError) as exc:
        return [f"unreadable inference response: {exc}"]
    return _missing(names, outputs)


def check_grpc_response(raw: bytes, outputs: Sequence[str]) -> list[str]:
    """Problems with one serialized ``ModelInferResponse``; empty when it has every output."""
    try:
        response = pb.ModelInferResponse.FromString(raw)
    except Exception as exc:  # noqa: BLE001 - protobuf's DecodeError and friends: the finding
        return [f"unreadable ModelInferResponse: {exc}"]
    problems = _missing({output.name for output in response.outputs}, outputs)
    if response.raw_output_contents and len(response.raw_output_contents) != len(response.outputs):
        problems.append(
            f"{len(response.raw_output_contents)} raw_output_contents for "
            f"{len(response.outputs)} outputs"
        )
    return problems
