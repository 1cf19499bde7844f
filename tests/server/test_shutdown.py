"""``--exit-timeout-secs`` is a promise: whatever a model is still doing (an execution on its
instance thread, ONNX Runtime's or a python model's, or a load in progress), the process is
gone within the timeout plus a second or two, with exit status 0; clients still waiting see
their connection closed or their RPC fail, never a hang; a second signal exits at once."""

from __future__ import annotations

import json
import re
import signal
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.model_repos import build_busy_repository, build_slow_start_repository
from tests.server_process import ServerProcess, start_server

EXIT_TIMEOUT = 1
SLACK = 2.0  # the promise: gone within the timeout plus this
CUT_GRPC = ("StatusCode.UNAVAILABLE", "StatusCode.CANCELLED")


@pytest.fixture(scope="module")
def busy_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_busy_repository(tmp_path_factory.mktemp("busy"))


def _send_infer(port: int, model: str) -> socket.socket:
    """An HTTP inference request to ``model`` on a connection of its own, not yet answered."""
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
    ).encode()
    connection = socket.create_connection(("127.0.0.1", port))
    connection.sendall(
        f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {len(body)}\r\n\r\n".encode() + body
    )
    return connection


def _send_load(port: int, model: str) -> socket.socket:
    connection = socket.create_connection(("127.0.0.1", port))
    connection.sendall(
        f"POST /v2/repository/models/{model}/load HTTP/1.1\r\nHost: x\r\n"
        "Content-Length: 0\r\n\r\n".encode()
    )
    return connection


def _answer(connection: socket.socket) -> bytes:
    """Everything the server sent until it closed the connection (a closed socket, not a hang:
    the server is gone by now)."""
    connection.settimeout(5)
    received = b""
    try:
        while chunk := connection.recv(65536):
            received += chunk
    except ConnectionResetError:
        pass
    finally:
        connection.close()
    return received


class _GrpcInfer(threading.Thread):
    """One gRPC inference request; ``status`` is the error code it ended with ("" if none)."""

    def __init__(self, url: str, model: str) -> None:
        super().__init__(daemon=True)
        self._url, self._model = url, model
        self.status: str | None = None

    def run(self) -> None:
        client = grpcclient.InferenceServerClient(self._url)
        tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.ones(1, np.float32))
        try:
            client.infer(self._model, [tensor], client_timeout=30)
            self.status = ""
        except InferenceServerException as exc:
            self.status = str(exc.status())
        finally:
            client.close()


def _wait_until_queued(server: ServerProcess, model: str) -> None:
    """Until one request waits for ``model``'s instance (so another one is running on it)."""
    pending = re.compile(rf'nv_inference_pending_request_count\{{model="{model}",[^}}]*\}} 1\b')
    deadline = time.monotonic() + 20
    while not pending.search(server.metrics()):
        assert time.monotonic() < deadline, server.log
        time.sleep(0.05)


def _in_flight_at_stop(log: str) -> int:
    """The in-flight requests the server said it was finishing when the stop began: the one
    process's count, or the sum of every front end's."""
    return sum(int(n) for n in re.findall(r"finishing (\d+) in-flight requests", log))


def _wait_for_in_flight(server: ServerProcess, count: int) -> None:
    deadline = time.monotonic() + 20
    while _in_flight_at_stop(server.log) < count:
        assert time.monotonic() < deadline, server.log
        time.sleep(0.02)


def _signal_and_time_exit(server: ServerProcess, signum: int = signal.SIGTERM) -> float:
    started = time.monotonic()
    server.proc.send_signal(signum)
    assert server.wait_exit(30) == 0, server.log
    return time.monotonic() - started


@pytest.mark.parametrize("model", ["sleepy", "spin"])  # a python model, an ONNX Runtime one
def test_the_exit_timeout_cuts_the_requests_still_running(busy_repo: Path, model: str) -> None:
    server = start_server(busy_repo, args=(f"--exit-timeout-secs={EXIT_TIMEOUT}",))
    try:
        running = _send_infer(server.port or 0, model)
        waiting = _GrpcInfer(server.grpc_url, model)
        waiting.start()
        _wait_until_queued(server, model)
        assert _signal_and_time_exit(server) < EXIT_TIMEOUT + SLACK, server.log
        assert b"200 OK" not in _answer(running)
        waiting.join(5)
        assert waiting.status in CUT_GRPC
        assert _in_flight_at_stop(server.log) == 2, server.log
        assert "exiting without waiting for the requests still running" in server.log
    finally:
        server.stop()


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_exits_at_once(busy_repo: Path, second: int) -> None:
    server = start_server(busy_repo, args=("--exit-timeout-secs=60",))
    try:
        running = _send_infer(server.port or 0, "sleepy")
        waiting = _GrpcInfer(server.grpc_url, "sleepy")
        waiting.start()
        _wait_until_queued(server, "sleepy")
        server.proc.send_signal(signal.SIGTERM)
        _wait_for_in_flight(server, 2)
        assert _signal_and_time_exit(server, second) < 1.0, server.log
        assert b"200 OK" not in _answer(running)
        waiting.join(5)
        assert waiting.status in CUT_GRPC
        assert f"{signal.Signals(second).name} again: exiting now" in server.log
    finally:
        server.stop()


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_during_the_start_up_loads_stops_within_the_timeout(
    tmp_path: Path, signum: int
) -> None:
    server = start_server(
        build_slow_start_repository(tmp_path),
        args=(f"--exit-timeout-secs={EXIT_TIMEOUT}",),
        timeout=0,
    )
    try:
        server.wait_for_log("initializing slow_start")
        assert _signal_and_time_exit(server, signum) < EXIT_TIMEOUT + SLACK, server.log
        assert "stopped during start-up" in server.log
        assert "Traceback" not in server.log
    finally:
        server.stop()


@pytest.mark.parametrize("exit_timeout", [EXIT_TIMEOUT, 60])  # 60: cut by a second signal
def test_a_load_in_progress_does_not_outlast_the_timeout(tmp_path: Path, exit_timeout: int) -> None:
    server = start_server(
        build_slow_start_repository(tmp_path),
        args=(f"--exit-timeout-secs={exit_timeout}", "--model-control-mode=explicit"),
    )
    try:
        loading = _send_load(server.port or 0, "slow_start")
        server.wait_for_log("initializing slow_start")
        if exit_timeout == EXIT_TIMEOUT:
            assert _signal_and_time_exit(server) < EXIT_TIMEOUT + SLACK, server.log
        else:
            server.proc.send_signal(signal.SIGTERM)
            server.wait_for_log("stopped")
            assert _signal_and_time_exit(server) < 1.0, server.log
        assert b"200 OK" not in _answer(loading)
    finally:
        server.stop()
