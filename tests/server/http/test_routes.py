"""Every HTTP route of triton-facts §1.1: status codes and body shapes, 404 and 405 answers."""

from __future__ import annotations

import json

import pytest

from tests.server.http.helpers import SIMPLE_SUM, error_of, simple_request
from tests.server_process import ServerProcess

# After every test, the 404s, 405s and refusals included: a good request is still answered.
pytestmark = pytest.mark.usefixtures("assert_still_serving")

SIMPLE_INPUT = {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}


# --- health -----------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v2/health/live", "/v2/health/ready"])
def test_health(server: ServerProcess, path: str) -> None:
    status, _, body = server.request("GET", path)
    assert status == 200
    assert body == b""


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/simple/ready",
        "/v2/models/simple/versions/1/ready",
        "/v2/models/identity_fp32/ready",
    ],
)
def test_model_ready(server: ServerProcess, path: str) -> None:
    status, _, body = server.request("GET", path)
    assert status == 200
    assert body == b""


@pytest.mark.parametrize(
    "path",
    [
        "/v2/models/nope/ready",
        "/v2/models/nope/versions/1/ready",
        "/v2/models/simple/versions/2/ready",
        "/v2/models/simple/versions/0/ready",
    ],
)
def test_model_not_ready(server: ServerProcess, path: str) -> None:
    response = server.request("GET", path)
    assert response[0] == 400
    assert error_of(response) == "Model version not ready"


# --- metadata and config ----------------------------------------------------------------------


def test_server_metadata(server: ServerProcess) -> None:
    status, headers, body = server.request("GET", "/v2")
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    parsed = json.loads(body)
    assert set(parsed) == {"name", "version", "extensions"}
    assert parsed["name"] == "triton"
    assert isinstance(parsed["version"], str)
    assert all(isinstance(e, str) for e in parsed["extensions"])
    assert {"binary_tensor_data", "model_configuration"} <= set(parsed["extensions"])


@pytest.mark.parametrize("path", ["/v2/models/simple", "/v2/models/simple/versions/1"])
def test_model_metadata(server: ServerProcess, path: str) -> None:
    status, headers, body = server.request("GET", path)
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    parsed = json.loads(body)
    assert list(parsed) == ["name", "versions", "platform", "inputs", "outputs"]
    assert parsed["name"] == "simple"
    assert parsed["versions"] == ["1"]
    assert parsed["platform"] == "onnxruntime_onnx"
    assert parsed["inputs"][0] == SIMPLE_INPUT
    assert [o["name"] for o in parsed["outputs"]] == ["OUTPUT0", "OUTPUT1"]


@pytest.mark.parametrize(
    "path", ["/v2/models/simple/config", "/v2/models/simple/versions/1/config"]
)
def test_model_config(server: ServerProcess, path: str) -> None:
    status, headers, body = server.request("GET", path)
    assert status == 200
    assert headers["Content-Type"] == "application/json"
    parsed = json.loads(body)
    assert parsed["name"] == "simple"
    assert parsed["max_batch_size"] == 8
    assert parsed["input"][0]["dims"] == [16]  # numbers, not int64 strings
    assert parsed["input"][0]["data_type"] == "TYPE_INT32"
    # Every primitive printed (always_print_primitive_fields).
    for key in ("is_shape_tensor", "allow_ragged_batch", "optional"):
        assert parsed["input"][0][key] is False
    assert parsed["output"][0]["label_filename"] == ""
    assert parsed["version_policy"] == {"latest": {"num_versions": 1}}
    assert parsed["backend"] == "onnxruntime"


@pytest.mark.parametrize("suffix", ["", "/config"])
def test_metadata_unknown_model_and_version(server: ServerProcess, suffix: str) -> None:
    response = server.request("GET", "/v2/models/nope" + suffix)
    assert response[0] == 400
    assert error_of(response) == "Request for unknown model: 'nope' is not found"
    response = server.request("GET", "/v2/models/simple/versions/7" + suffix)
    assert response[0] == 404
    assert error_of(response) == "Request for unknown model: 'simple' version 7 is not found"


# --- infer ------------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v2/models/simple/infer", "/v2/models/simple/versions/1/infer"])
def test_infer_routes(server: ServerProcess, path: str) -> None:
    status, headers, body = server.request("POST", path, json.dumps(simple_request()).encode())
    assert status == 200, body
    assert headers["Content-Type"] == "application/json"
    parsed = json.loads(body)
    assert list(parsed) == ["model_name", "model_version", "outputs"]
    assert parsed["model_name"] == "simple"
    assert parsed["model_version"] == "1"
    assert parsed["outputs"][0] == {
        "name": "OUTPUT0",
        "datatype": "INT32",
        "shape": [1, 16],
        "data": SIMPLE_SUM,
    }


def test_infer_unknown_model(server: ServerProcess) -> None:
    response = server.request(
        "POST", "/v2/models/nope/infer", json.dumps(simple_request()).encode()
    )
    assert response[0] == 400
    assert error_of(response) == "Request for unknown model: 'nope' is not found"


def test_infer_unknown_version(server: ServerProcess) -> None:
    response = server.request(
        "POST", "/v2/models/simple/versions/3/infer", json.dumps(simple_request()).encode()
    )
    assert response[0] == 404
    assert error_of(response) == "Request for unknown model: 'simple' version 3 is not found"


# --- 404 and 405 ------------------------------------------------------------------------------


NOT_FOUND = [
    "/",
    "/v1",
    "/v2/",
    "/v2/health",
    "/v2/health/",
    "/v2/health/alive",
    "/v2/models",
    "/v2/models/",
    "/v2/models/simple/",
    "/v2/models/simple/versions",
    "/v2/models/simple/versions/",
    "/v2/models/simple/versions/v1",
    "/v2/models/simple/versions/v1/ready",
    "/v2/models/simple/versions/v1/config",
    "/v2/models/simple/versions/-1/infer",
    "/v2/models/simple/versions/1.0",
    "/v2/models/simple/infer/extra",
    "/v2/models/simple/unknown",
    "/v2/models/simple/versions/1/unknown",
    "/v3/models/simple",
]


@pytest.mark.parametrize("path", NOT_FOUND)
@pytest.mark.parametrize("method", ["GET", "POST"])
def test_unknown_route(server: ServerProcess, path: str, method: str) -> None:
    body = b"{}" if method == "POST" else None
    response = server.request(method, path, body)
    assert response[0] == 404
    assert json.loads(response[2]) == {"error": "Not Found"}
    assert response[1]["Content-Type"] == "application/json"


WRONG_METHOD = [
    ("POST", "/v2/health/live"),
    ("POST", "/v2/health/ready"),
    ("PUT", "/v2/health/live"),
    ("POST", "/v2"),
    ("DELETE", "/v2"),
    ("POST", "/v2/models/simple"),
    ("POST", "/v2/models/simple/versions/1"),
    ("POST", "/v2/models/simple/ready"),
    ("POST", "/v2/models/simple/config"),
    ("GET", "/v2/models/simple/infer"),
    ("GET", "/v2/models/simple/versions/1/infer"),
    ("PUT", "/v2/models/simple/infer"),
    ("DELETE", "/v2/models/simple/infer"),
    ("PATCH", "/v2/models/simple/config"),
]


@pytest.mark.parametrize(("method", "path"), WRONG_METHOD)
def test_wrong_method(server: ServerProcess, method: str, path: str) -> None:
    body = b"{}" if method in ("POST", "PUT", "PATCH") else None
    response = server.request(method, path, body)
    assert response[0] == 405
    assert json.loads(response[2]) == {"error": "Method Not Allowed"}
    assert response[1]["Content-Type"] == "application/json"


def test_error_bodies_parse_for_tritonclient(server: ServerProcess) -> None:
    """Non-200 answers carry a non-empty JSON error (an empty body breaks the client)."""
    for method, path in [
        ("GET", "/nowhere"),
        ("POST", "/v2/health/live"),
        ("GET", "/v2/models/nope"),
    ]:
        response = server.request(method, path, b"" if method == "POST" else None)
        assert response[0] >= 400
        assert error_of(response)
