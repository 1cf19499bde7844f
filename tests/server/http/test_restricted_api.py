"""``--http-restricted-api`` on a live server, as Triton's ``qa/L0_http``
``http_restricted_api_test`` runs it: restricted categories are 403 with Triton's JSON error
without their header or with a wrong value, served with it; the others stay open."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.server.http.helpers import SIMPLE_SUM, error_of, simple_request
from tests.server_process import EXAMPLES, ServerProcess, start_server

ADMIN = {"admin-key": "admin-value"}
INFER = {"infer-key": "infer-value"}
FLAGS = (
    "--http-restricted-api=model-repository,health:admin-key=admin-value",
    "--http-restricted-api=inference,metadata:infer-key=infer-value",
    "--allow-client-shm=true",
)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = start_server(EXAMPLES, args=FLAGS, probe_headers=ADMIN)
    assert process.port is not None, process.log
    yield process
    assert process.stop() == 0, process.log


def _refused(response: tuple[int, dict[str, str], bytes], header: str) -> None:
    assert response[0] == 403, response
    assert error_of(response) == f"This API is restricted, expecting header '{header}'"
    assert json.loads(response[2]) == {
        "error": f"This API is restricted, expecting header '{header}'"
    }


@pytest.mark.parametrize(
    "method, path, header",
    [
        ("GET", "/v2/health/live", "admin-key"),
        ("GET", "/v2/health/ready", "admin-key"),
        ("GET", "/v2/models/simple/ready", "admin-key"),
        ("POST", "/v2/repository/index", "admin-key"),
        ("POST", "/v2/repository/models/simple/unload", "admin-key"),
        ("GET", "/v2", "infer-key"),
        ("GET", "/v2/models/simple", "infer-key"),
        ("GET", "/v2/models/simple/versions/1", "infer-key"),
        ("POST", "/v2/models/simple/infer", "infer-key"),
        ("POST", "/v2/models/simple/versions/1/infer", "infer-key"),
        # The restriction is checked before the method, as in Triton.
        ("DELETE", "/v2/health/live", "admin-key"),
        ("GET", "/v2/models/simple/infer", "infer-key"),
        ("PUT", "/v2", "infer-key"),
    ],
)
def test_restricted_without_or_with_a_wrong_header(
    server: ServerProcess, method: str, path: str, header: str
) -> None:
    body = b"{}" if method in ("POST", "PUT") else None
    _refused(server.request(method, path, body), header)
    _refused(server.request(method, path, body, {header: "wrong"}), header)
    other = "infer-key" if header == "admin-key" else "admin-key"
    right_value_wrong_key = {other: ADMIN.get(header, INFER.get(header, ""))}
    _refused(server.request(method, path, body, right_value_wrong_key), header)
    # refused for the header alone: with the right one it gets past the restriction
    right = ADMIN if header == "admin-key" else INFER
    status, _, answer = server.request(method, path, body, right)
    assert status != 403, answer
    assert server.request("GET", "/v2", None, INFER)[0] == 200


@pytest.mark.parametrize(
    "path, headers",
    [("/v2/health/live", ADMIN), ("/v2/health/ready", ADMIN), ("/v2/models/simple/ready", ADMIN),
     ("/v2", INFER), ("/v2/models/simple", INFER)],
)
def test_served_with_the_right_header(
    server: ServerProcess, path: str, headers: dict[str, str]
) -> None:
    status, _, body = server.request("GET", path, None, headers)
    assert status == 200, body
    # Header names are case-insensitive in HTTP.
    upper = {name.upper(): value for name, value in headers.items()}
    assert server.request("GET", path, None, upper)[0] == 200


def test_infer_with_the_right_header(server: ServerProcess) -> None:
    body = json.dumps(simple_request()).encode()
    status, _, answer = server.request("POST", "/v2/models/simple/infer", body, INFER)
    assert status == 200, answer
    assert json.loads(answer)["outputs"][0]["data"] == SIMPLE_SUM


def test_model_repository_with_its_header_reaches_the_api(server: ServerProcess) -> None:
    response = server.request("POST", "/v2/repository/models/simple/unload", b"", ADMIN)
    assert response[0] == 503
    assert "explicit model load / unload is not allowed" in error_of(response)
    assert server.request("POST", "/v2/repository/index", b"{}", ADMIN)[0] == 200


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/v2/models/stats"), ("GET", "/v2/models/simple/stats"),
     ("GET", "/v2/models/simple/config"), ("GET", "/v2/systemsharedmemory/status"),
     ("GET", "/v2/cudasharedmemory/status")],
)
def test_unrestricted_categories_stay_open(server: ServerProcess, method: str, path: str) -> None:
    status, _, body = server.request(method, path)
    assert status == 200, body
    assert server.request(method, path, None, INFER)[0] == 200


def test_unknown_paths_are_still_404(server: ServerProcess) -> None:
    response = server.request("GET", "/v2/nowhere")
    assert response[0] == 404
    assert error_of(response) == "Not Found"
    assert server.request("GET", "/v2", None, INFER)[0] == 200


def _exchange(sock: socket.socket, request: bytes) -> bytes:
    sock.sendall(request)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, rest = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(rest) < length:
        rest += sock.recv(65536)
    return head + b"\r\n\r\n" + rest


@pytest.mark.parametrize("path", ["/v2/models/simple/infer", "/v2/repository/index"])
def test_a_refused_body_is_read_and_the_connection_kept(server: ServerProcess, path: str) -> None:
    """The refusal comes before the body is used; the body is read and dropped, and the next
    request on the connection is served (the fast infer path and the application alike)."""
    body = json.dumps(simple_request()).encode() + b" " * 200_000
    refused = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    good = json.dumps(simple_request()).encode()
    served = (
        "POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\ninfer-key: infer-value\r\n"
        f"Content-Length: {len(good)}\r\n\r\n"
    ).encode() + good
    assert server.port is not None
    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
        first = _exchange(sock, refused)
        assert first.startswith(b"HTTP/1.1 403 Forbidden\r\n"), first[:200]
        assert first.endswith(b'{"error":"This API is restricted, expecting header \''
                              + (b"infer-key" if "infer" in path else b"admin-key") + b"'\"}")
        second = _exchange(sock, served)
        assert second.startswith(b"HTTP/1.1 200 OK\r\n"), second[:300]


def test_tritonclient_http(server: ServerProcess) -> None:
    """What Triton's test does, with NVIDIA's client."""
    client = httpclient.InferenceServerClient(server.url)
    try:
        client.get_inference_statistics("simple")
        client.get_inference_statistics("simple", headers=INFER)
        with pytest.raises(InferenceServerException, match="This API is restricted"):
            client.unload_model("simple", headers=INFER)
        with pytest.raises(
            InferenceServerException, match="explicit model load / unload is not allowed"
        ):
            client.unload_model("simple", headers=ADMIN)
        with pytest.raises(InferenceServerException, match="This API is restricted"):
            client.get_server_metadata()
        assert client.get_server_metadata(headers=INFER)["name"] == "triton"
        inputs = [
            httpclient.InferInput("INPUT0", [1, 16], "INT32"),
            httpclient.InferInput("INPUT1", [1, 16], "INT32"),
        ]
        for tensor in inputs:
            tensor.set_data_from_numpy(np.ones((1, 16), dtype=np.int32))
        with pytest.raises(InferenceServerException, match="This API is restricted"):
            client.infer("simple", inputs, headers={"test": "1"})
        result = client.infer("simple", inputs, headers=INFER)
        assert (result.as_numpy("OUTPUT0") == 2).all()
    finally:
        client.close()
