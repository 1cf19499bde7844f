"""A failing accept pauses its socket and is logged once, and accepting resumes by itself; out
of file descriptors, the real server logs a line now and then instead of a flood, does not spin,
and serves again, over HTTP, gRPC and metrics, once descriptors are free: a connection that
waited in the backlog meanwhile is answered too."""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import resource
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tornado.web
import tritonclient.grpc as grpcclient

from scripts import make_models
from server import event_loop
from server.http.delegates import TornadoDelegate
from server.http.endpoint import service
from server.listener import PAUSE_SECS, Listener
from tests.server.http.helpers import parse_raw_response, read_response
from tests.server_process import ServerProcess, start_server

FREE_DESCRIPTORS = 16  # left to the server under its lowered limit
EXHAUSTED_SECS = 2.0


class _FailingSocket(socket.socket):
    """A listening socket whose first ``failures`` accepts fail with ``code``."""

    def __init__(self, code: int, failures: int) -> None:
        super().__init__(socket.AF_INET, socket.SOCK_STREAM)
        self.code, self.failures, self.accepts = code, failures, 0

    def accept(self) -> tuple[socket.socket, object]:
        self.accepts += 1
        if self.failures:
            self.failures -= 1
            raise OSError(self.code, os.strerror(self.code))
        return super().accept()


class _Hello(tornado.web.RequestHandler):
    def get(self) -> None:
        self.write("hello")


@pytest.mark.parametrize("code", [errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM])
def test_a_failing_accept_pauses_and_resumes(caplog: pytest.LogCaptureFixture, code: int) -> None:
    failures = 3
    sock = _FailingSocket(code, failures)

    async def request_once() -> tuple[bytes, float]:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        sock.setblocking(False)
        app = tornado.web.Application([("/", _Hello)])
        listener = Listener(service(TornadoDelegate(app)), [sock], "test")
        started = time.monotonic()
        reader, writer = await asyncio.open_connection("127.0.0.1", listener.port)
        writer.write(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        listener.close()
        return answer, time.monotonic() - started

    with caplog.at_level(logging.ERROR, logger="server.listener"):
        answer, took = event_loop.run(request_once())
    assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello")
    assert took >= failures * PAUSE_SECS  # it paused after each failure...
    assert sock.accepts <= failures + 3  # ...instead of trying again at once
    (record,) = caplog.records
    error = OSError(code, os.strerror(code))
    assert record.getMessage() == f"test: accepting a connection failed: {error}"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    make_models.save(make_models.identity("FP32", ["batch", 4]), tmp_path / "m" / "1" / "model.onnx")
    # The limits are put on one process's pid: the one-process layout, where it is the server's.
    started = start_server(tmp_path, args=("--frontends=0",))
    yield started
    started.stop()


def _descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _cpu_secs(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _connect(port: int | None) -> socket.socket:
    assert port is not None
    return socket.create_connection(("127.0.0.1", port))


def test_descriptor_exhaustion_is_logged_sparingly_and_survived(server: ServerProcess) -> None:
    pid = server.proc.pid
    limit = _descriptors(pid) + FREE_DESCRIPTORS
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, limit))
    held = [_connect(server.port) for _ in range(FREE_DESCRIPTORS + 8)]
    try:
        deadline = time.monotonic() + 10
        while _descriptors(pid) < limit:
            assert time.monotonic() < deadline, _descriptors(pid)
            time.sleep(0.02)
        # Every listener now fails to accept; these wait in the backlogs.
        waiting = _connect(server.port)
        waiting.sendall(b"GET /v2/health/ready HTTP/1.1\r\nHost: x\r\n\r\n")
        held += [_connect(server.grpc_port), _connect(server.metrics_port)]
        time.sleep(0.2)
        logged_before, cpu_before = len(server.log), _cpu_secs(pid)
        time.sleep(EXHAUSTED_SECS)
        logged = server.log[logged_before:]
        cpu = _cpu_secs(pid) - cpu_before
        assert len(logged) < 4096 and logged.count("\n") < 20, logged[:4096]
        assert cpu < 0.15 * EXHAUSTED_SECS, cpu
        assert "HTTPService: accepting a connection failed: [Errno 24]" in server.log
    finally:
        for connection in held:
            connection.close()
    waiting.settimeout(10)
    assert parse_raw_response(read_response(waiting))[0] == 200
    waiting.close()
    assert server.request("GET", "/v2/health/ready")[0] == 200
    assert "nv_inference_request_success" in server.metrics()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert client.is_server_ready(client_timeout=10)
    assert server.stop() == 0
