"""Small helpers shared by the HTTP integration tests (raw requests through ``ServerProcess``)."""

from __future__ import annotations

import json
import socket
import struct
from collections.abc import Iterable
from typing import Any

import numpy as np

from tests.server_process import ServerProcess

Response = tuple[int, dict[str, str], bytes]

SIMPLE_A = list(range(16))
SIMPLE_B = [1] * 16
SIMPLE_SUM = [a + b for a, b in zip(SIMPLE_A, SIMPLE_B)]
SIMPLE_DIFF = [a - b for a, b in zip(SIMPLE_A, SIMPLE_B)]


def json_input(name: str, datatype: str, shape: list[int], data: Any) -> dict[str, Any]:
    return {"name": name, "datatype": datatype, "shape": shape, "data": data}


def simple_request(**extra: Any) -> dict[str, Any]:
    """A JSON request for the ``simple`` add/sub model (batch 1)."""
    return {
        "inputs": [
            json_input("INPUT0", "INT32", [1, 16], SIMPLE_A),
            json_input("INPUT1", "INT32", [1, 16], SIMPLE_B),
        ],
        **extra,
    }


def post_json(
    server: ServerProcess, model: str, body: Any, headers: dict[str, str] | None = None
) -> Response:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    return server.request("POST", f"/v2/models/{model}/infer", data, headers)


def binary_body(header: dict[str, Any], *blobs: bytes) -> tuple[bytes, dict[str, str]]:
    """JSON header + blobs, and the ``Inference-Header-Content-Length`` header for it."""
    text = json.dumps(header).encode()
    return text + b"".join(blobs), {"Inference-Header-Content-Length": str(len(text))}


def error_of(response: Response) -> str:
    """The ``error`` text of a refusal; asserts the body is exactly ``{"error": str}`` JSON."""
    status, headers, body = response
    assert headers.get("Content-Type") == "application/json", (status, headers, body)
    parsed = json.loads(body)
    assert isinstance(parsed, dict) and list(parsed) == ["error"], body
    assert isinstance(parsed["error"], str) and parsed["error"], body
    return parsed["error"]


def split_binary(response: Response) -> tuple[dict[str, Any], bytes]:
    """(JSON header, binary tail) of a response with ``Inference-Header-Content-Length``."""
    _, headers, body = response
    length = int(headers["Inference-Header-Content-Length"])
    return json.loads(body[:length]), body[length:]


def serialize_bytes(elements: Iterable[bytes]) -> bytes:
    """The binary extension's BYTES encoding: ``<uint32 LE length><bytes>`` per element."""
    return b"".join(struct.pack("<I", len(e)) + e for e in elements)


def chunked_request(
    server: ServerProcess,
    path: str,
    chunks: Iterable[bytes],
    headers: dict[str, str] | None = None,
) -> Response:
    """POST ``chunks`` with ``Transfer-Encoding: chunked`` (one HTTP chunk per item). A server
    may answer (and close) before the last chunk is sent, as for an oversize body: the answer
    is read whether or not all the chunks went out."""
    assert server.port is not None
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n"
    head += "".join(f"{key}: {value}\r\n" for key, value in (headers or {}).items())
    body = b"".join(f"{len(c):x}\r\n".encode() + c + b"\r\n" for c in chunks if c)
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        try:
            sock.sendall(head.encode() + b"\r\n" + body + b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered already; the response is waiting to be read
        return parse_raw_response(read_response(sock))


def raw_exchange(server: ServerProcess, data: bytes, timeout: float = 10.0) -> bytes:
    """Send ``data`` on a fresh socket and read until the server closes it or goes quiet."""
    assert server.port is not None
    with socket.create_connection(("127.0.0.1", server.port), timeout=timeout) as sock:
        sock.sendall(data)
        return read_response(sock)


def read_response(sock: socket.socket) -> bytes:
    """Read one HTTP response (headers + Content-Length body) from ``sock``."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return data
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        key, _, value = line.partition(b":")
        if key.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head + b"\r\n\r\n" + rest


def parse_raw_response(data: bytes) -> Response:
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        key, _, value = line.partition(":")
        headers[key.strip()] = value.strip()
    return status, headers, body


def assert_simple_ok(server: ServerProcess) -> None:
    """A good request still succeeds (for servers other than the session one)."""
    status, _, body = post_json(server, "simple", simple_request())
    assert status == 200, body
    outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    assert outputs == {"OUTPUT0": SIMPLE_SUM, "OUTPUT1": SIMPLE_DIFF}


def as_le_bytes(values: list[Any], dtype: Any) -> bytes:
    return np.asarray(values, dtype=dtype).tobytes()
