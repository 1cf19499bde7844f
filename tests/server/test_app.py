"""Start-up and shutdown of the real server process: model failures, signals, readiness."""

from __future__ import annotations

import http.client
import json
import shutil
import signal
import socket
import time
from pathlib import Path

import pytest

from scripts import make_models
from tests.model_repos import build_napping_repository, slow_http_request
from tests.server.http.helpers import parse_raw_response, read_response
from tests.server_process import EXAMPLES, start_server


@pytest.fixture
def repo_with_broken_model(tmp_path: Path) -> Path:
    shutil.copytree(EXAMPLES / "simple", tmp_path / "simple")
    broken = tmp_path / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"this is not an onnx file")
    return tmp_path


def test_exit_on_error_true_exits_non_zero(repo_with_broken_model: Path) -> None:
    server = start_server(repo_with_broken_model, timeout=30)
    assert server.wait_exit() != 0
    assert server.port is None
    assert "broken" in server.log and "failed to load" in server.log


def test_exit_on_error_false_serves_the_other_models(repo_with_broken_model: Path) -> None:
    server = start_server(repo_with_broken_model, args=("--exit-on-error=false",))
    try:
        assert server.port is not None, server.log
        assert server.request("GET", "/v2/models/simple/ready")[0] == 200
        status, _, body = server.request("GET", "/v2/models/broken/ready")
        assert status == 400
        # strict readiness: one model is not ready, so the server is not ready; live it is
        assert server.request("GET", "/v2/health/ready")[0] == 400
        assert server.request("GET", "/v2/health/live")[0] == 200
        status, _, body = server.request("GET", "/v2/models/broken")
        assert status == 404 and b"has no available versions" in body
    finally:
        server.stop()


def test_non_strict_readiness_is_ready_with_a_failed_model(repo_with_broken_model: Path) -> None:
    server = start_server(
        repo_with_broken_model, args=("--exit-on-error=false", "--strict-readiness=false")
    )
    try:
        assert server.request("GET", "/v2/health/ready")[0] == 200
    finally:
        server.stop()


def test_missing_repository_exits_non_zero(tmp_path: Path) -> None:
    server = start_server(tmp_path / "absent", timeout=30)
    assert server.wait_exit() != 0
    assert "failed to stat model repository path" in server.log


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_stops_cleanly(tmp_path: Path, signum: int) -> None:
    make_models.save(make_models.identity("FP32", ["batch", 4]), tmp_path / "m" / "1" / "model.onnx")
    server = start_server(tmp_path)
    assert server.port is not None, server.log
    server.proc.send_signal(signum)
    assert server.wait_exit(30) == 0
    assert "stopped" in server.log


def test_version_policy_serves_selected_versions(tmp_path: Path) -> None:
    for version in (1, 2, 3):
        make_models.save(make_models.identity("FP32", ["batch", 4]), tmp_path / "m" / str(version) / "model.onnx")
    (tmp_path / "m" / "config.pbtxt").write_text(
        'version_policy: { specific: { versions: [1, 3] } }\n'
    )
    make_models.save(make_models.identity("FP32", ["batch", 4]), tmp_path / "latest" / "1" / "model.onnx")
    make_models.save(make_models.identity("FP32", ["batch", 4]), tmp_path / "latest" / "2" / "model.onnx")
    server = start_server(tmp_path)
    try:
        assert server.request("GET", "/v2/models/m/versions/1/ready")[0] == 200
        assert server.request("GET", "/v2/models/m/versions/2/ready")[0] == 400
        assert server.request("GET", "/v2/models/m/versions/3/ready")[0] == 200
        status, _, body = server.request("GET", "/v2/models/m")
        assert status == 200 and b'"versions":["1","3"]' in body
        status, _, body = server.request("GET", "/v2/models/m/versions/2")
        assert status == 404
        assert b"Request for unknown model: 'm' version 2 is not found" in body
        # latest{1} by default: only version 2 of "latest"
        assert server.request("GET", "/v2/models/latest/versions/1/ready")[0] == 400
        assert server.request("GET", "/v2/models/latest/versions/2/ready")[0] == 200
    finally:
        server.stop()


def test_sigterm_finishes_in_flight_requests_then_exits(tmp_path: Path) -> None:
    """A request running when SIGTERM arrives is answered; a new one on an open connection
    gets 503; readiness turns false meanwhile; the exit code is 0."""
    # 256 rows: a request of 2.6 s, asleep (no CPU taken from the tests beside it)
    server = start_server(build_napping_repository(tmp_path, seconds_per_row=0.01))
    assert server.port is not None, server.log
    keep_alive = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    keep_alive.request("GET", "/v2/health/ready")
    first = keep_alive.getresponse()
    first.read()
    assert first.status == 200  # the connection stays open for the requests below
    busy = socket.create_connection(("127.0.0.1", server.port))
    busy.sendall(slow_http_request(256, "busy"))
    time.sleep(0.2)
    server.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    keep_alive.request("GET", "/v2/health/ready")
    response = keep_alive.getresponse()
    response.read()
    assert response.status == 400  # not ready while draining
    late_body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2048], "data": [0.0] * 2048}]}
    keep_alive.request("POST", "/v2/models/slow/infer", json.dumps(late_body).encode())
    late = keep_alive.getresponse()
    assert late.status == 503
    assert b"Server is stopping" in late.read()
    answered = parse_raw_response(read_response(busy))
    busy.close()
    keep_alive.close()
    assert answered[0] == 200
    assert server.wait_exit(30) == 0


@pytest.mark.parametrize("flag", ["--http-port", "--grpc-port"])
def test_port_in_use_is_a_clean_start_up_error(tmp_path: Path, flag: str) -> None:
    make_models.save(make_models.identity("FP32", ["batch", 4]), tmp_path / "m" / "1" / "model.onnx")
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        port = taken.getsockname()[1]
        server = start_server(tmp_path, args=(f"{flag}={port}",), timeout=30)
        assert server.wait_exit() == 1
        assert "error:" in server.log and "Traceback" not in server.log
    finally:
        taken.close()
