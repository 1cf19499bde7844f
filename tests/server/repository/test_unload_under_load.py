"""No accepted request is lost across an unload or a reload: with requests running and queued
on the one-instance ``slow`` model (HTTP and gRPC), every request either succeeds with the right
data or is refused cleanly (a 4xx/503 JSON error, a gRPC status naming the model); never a
dropped connection, a 500 or wrong data."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.model_repos import build_slow_repository, slow_http_request
from tests.server.http.helpers import parse_raw_response, read_response
from tests.server.repository.lifecycle_helpers import wait_until
from tests.server_process import ServerProcess, start_server

WIDTH = 2048
ROWS = 16
REFUSED_HTTP = (400, 404, 503)
REFUSED_GRPC = ("StatusCode.UNAVAILABLE", "StatusCode.NOT_FOUND", "StatusCode.INVALID_ARGUMENT")


@dataclass
class Outcome:
    started: float
    ok: bool  # succeeded with the right data
    refused: bool = False  # a clean refusal
    problem: str = ""  # anything else: the test fails


@dataclass
class Traffic:
    """Threads sending requests to ``slow`` until stopped; every outcome recorded."""

    server: ServerProcess
    http_threads: int = 3
    grpc_threads: int = 1
    outcomes: list[Outcome] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)

    def start(self) -> None:
        for index in range(self.http_threads):
            self.threads.append(threading.Thread(target=self._http, args=(index,)))
        for _ in range(self.grpc_threads):
            self.threads.append(threading.Thread(target=self._grpc))
        for thread in self.threads:
            thread.start()

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
            assert not thread.is_alive()

    def successes(self) -> int:
        return sum(o.ok for o in self.outcomes)

    def problems(self) -> list[str]:
        return [o.problem for o in self.outcomes if o.problem]

    def _http(self, index: int) -> None:
        count = 0
        while not self.stop.is_set():
            count += 1
            started = time.monotonic()
            self.outcomes.append(http_outcome(self.server, ROWS, f"t{index}-{count}", started))

    def _grpc(self) -> None:
        client = grpcclient.InferenceServerClient(self.server.grpc_url)
        data = np.full((ROWS, WIDTH), 2.0, np.float32)
        while not self.stop.is_set():
            started = time.monotonic()
            tensor = grpcclient.InferInput("INPUT0", [ROWS, WIDTH], "FP32")
            tensor.set_data_from_numpy(data)
            try:
                result = client.infer("slow", [tensor])
            except InferenceServerException as exc:
                clean = exc.status() in REFUSED_GRPC and "'slow'" in (exc.message() or "")
                problem = "" if clean else f"gRPC {exc.status()}: {exc.message()}"
                self.outcomes.append(Outcome(started, False, clean, problem))
                continue
            out = result.as_numpy("OUTPUT0")
            good = out is not None and np.array_equal(out, data)
            self.outcomes.append(Outcome(started, good, problem="" if good else "gRPC wrong data"))
        client.close()


def http_outcome(server: ServerProcess, rows: int, request_id: str, started: float) -> Outcome:
    """Send one binary request for ``rows`` rows of ones on a fresh connection and judge it."""
    assert server.port is not None
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as sock:
            sock.sendall(slow_http_request(rows, request_id))
            raw = read_response(sock)
    except OSError as exc:
        return Outcome(started, False, problem=f"{request_id}: connection error {exc!r}")
    if not raw:
        return Outcome(started, False, problem=f"{request_id}: connection closed, no response")
    return judge_http(parse_raw_response(raw), rows, request_id, started)


def judge_http(
    response: tuple[int, dict[str, str], bytes], rows: int, request_id: str, started: float
) -> Outcome:
    status, headers, body = response
    if status == 200:
        length = int(headers["Inference-Header-Content-Length"])
        header = json.loads(body[:length])
        data = np.frombuffer(body[length:], dtype=np.float32)
        good = (
            header.get("id") == request_id
            and header["outputs"][0]["shape"] == [rows, WIDTH]
            and data.size == rows * WIDTH
            and bool(np.all(data == 1.0))
        )
        return Outcome(started, good, problem="" if good else f"{request_id}: wrong data")
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        error = None
    if status in REFUSED_HTTP and isinstance(error, str) and error:
        return Outcome(started, False, refused=True)
    return Outcome(started, False, problem=f"{request_id}: HTTP {status} {body[:200]!r}")


@pytest.fixture
def slow_server(tmp_path: Path) -> Iterator[ServerProcess]:
    server = start_server(
        build_slow_repository(tmp_path / "repo"),
        args=("--model-control-mode=explicit", "--load-model=slow"),
    )
    assert server.port is not None, server.log
    yield server
    server.stop()


def _busy_request(server: ServerProcess) -> tuple[socket.socket, float]:
    """A long request (256 rows), sent in full and running when this returns."""
    assert server.port is not None
    busy = socket.create_connection(("127.0.0.1", server.port), timeout=60)
    started = time.monotonic()
    busy.sendall(slow_http_request(256, "busy"))  # 2 MiB: returns once the server read it
    time.sleep(0.2)
    return busy, started


def test_unload_under_concurrent_inference_loses_no_accepted_request(
    slow_server: ServerProcess,
) -> None:
    client = httpclient.InferenceServerClient(slow_server.url, network_timeout=120)
    busy, busy_started = _busy_request(slow_server)
    traffic = Traffic(slow_server)
    traffic.start()
    try:
        time.sleep(0.3)  # requests queue behind the busy one on the single instance
        client.unload_model("slow")
        unloaded_at = time.monotonic()
        assert not client.is_model_ready("slow")
        time.sleep(0.3)
    finally:
        traffic.finish()
    busy_outcome = judge_http(
        parse_raw_response(read_response(busy)), 256, "busy", busy_started
    )
    busy.close()

    assert busy_outcome.ok, busy_outcome.problem  # admitted before the unload: answered
    assert traffic.problems() == []
    late = [o for o in traffic.outcomes if o.started > unloaded_at]
    assert late and all(o.refused for o in late)  # after the unload: refused, cleanly
    assert any(o.ok for o in traffic.outcomes)  # and some were served before it
    assert not client.is_model_ready("slow")
    after = http_outcome(slow_server, 1, "after", time.monotonic())
    assert after.refused, after.problem
    # loaded again, the model serves: the unload under load left nothing broken behind
    client.load_model("slow")
    assert client.is_model_ready("slow")
    again = http_outcome(slow_server, 2, "again", time.monotonic())
    assert again.ok, again
    client.close()


def test_reload_under_load_answers_every_request(slow_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(slow_server.url, network_timeout=120)
    traffic = Traffic(slow_server)
    traffic.start()
    busy: socket.socket | None = None
    try:
        wait_until(lambda: traffic.successes() >= 4, 30)
        busy, busy_started = _busy_request(slow_server)
        client.load_model(
            "slow",
            config=json.dumps(
                {"max_batch_size": 128, "instance_group": [{"kind": "KIND_CPU", "count": 1}]}
            ),
        )
        assert client.get_model_config("slow")["max_batch_size"] == 128
        mark = traffic.successes()
        wait_until(lambda: traffic.successes() >= mark + 4, 30)
        client.load_model("slow")  # back to config.pbtxt (max_batch_size 256)
        mark = traffic.successes()
        wait_until(lambda: traffic.successes() >= mark + 4, 30)
    finally:
        traffic.finish()
    assert busy is not None
    busy_outcome = judge_http(
        parse_raw_response(read_response(busy)), 256, "busy", busy_started
    )
    busy.close()
    assert busy_outcome.ok, busy_outcome.problem
    assert traffic.problems() == []
    assert all(o.ok for o in traffic.outcomes), [o for o in traffic.outcomes if not o.ok]
    assert client.get_model_config("slow")["max_batch_size"] == 256
    assert client.is_model_ready("slow")
    client.close()
