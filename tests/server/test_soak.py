"""A short concurrent soak: several clients at once for a few seconds each, sending valid
requests (HTTP binary and gRPC, every one with its own data), malformed and oversize ones, and
requests they abandon while queued. Every valid request gets exactly one answer holding its
own data, the server's statistics count exactly the valid requests, abandoned ones never run,
and the server logs no fault."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from scripts import make_models
from tests.server_process import EXAMPLES, ServerProcess, start_server

SECONDS = 3.0
WRONG_SHAPE = b'{"inputs": [{"name": "INPUT0", "shape": [1, 3], "datatype": "INT32", "data": [1, 2, 3]}]}'
QUEUED = """max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 5000000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    extra = tmp_path_factory.mktemp("soak_repo")
    make_models.save(make_models.identity("FP32", ["batch", 4]), extra / "queued/1/model.onnx")
    make_models.write_text(QUEUED, extra / "queued" / "config.pbtxt")
    process = start_server(EXAMPLES, extra, args=("--http-max-input-size=65536",))
    assert process.port is not None and process.grpc_port is not None, process.log
    yield process
    process.stop()


def _binary_simple(a: np.ndarray, b: np.ndarray) -> tuple[bytes, dict[str, str]]:
    header = json.dumps(
        {
            "inputs": [
                {"name": n, "shape": [1, 16], "datatype": "INT32",
                 "parameters": {"binary_data_size": 64}}
                for n in ("INPUT0", "INPUT1")
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    headers = {"Inference-Header-Content-Length": str(len(header))}
    return header + a.tobytes() + b.tobytes(), headers


class Tally:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.valid = 0
        self.wrong: list[str] = []
        self.statuses: dict[int, int] = {}

    def status(self, code: int) -> None:
        with self.lock:
            self.statuses[code] = self.statuses.get(code, 0) + 1


def _for(seconds: float, step: Callable[[int], None]) -> None:
    deadline = time.monotonic() + seconds
    index = 0
    while time.monotonic() < deadline:
        step(index)
        index += 1


def test_concurrent_soak(server: ServerProcess) -> None:
    import http.client

    tally = Tally()
    assert server.port is not None

    def valid_http(worker: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", server.port or 0, timeout=30)

        def step(index: int) -> None:
            a = np.full((1, 16), worker * 100_000 + index, dtype=np.int32)
            b = np.arange(16, dtype=np.int32).reshape(1, 16)
            body, headers = _binary_simple(a, b)
            connection.request("POST", "/v2/models/simple/infer", body, headers)
            response = connection.getresponse()
            data = response.read()
            tally.status(response.status)
            length = int(response.getheader("Inference-Header-Content-Length") or 0)
            got = np.frombuffer(data[length : length + 64], dtype=np.int32)
            with tally.lock:
                tally.valid += 1
                if response.status != 200 or not np.array_equal(got, (a + b).ravel()):
                    tally.wrong.append(f"http worker {worker} request {index}: {data[:200]!r}")

        _for(SECONDS, step)
        connection.close()

    def valid_grpc(worker: int) -> None:
        client = grpcclient.InferenceServerClient(server.grpc_url)

        def step(index: int) -> None:
            a = np.full((1, 16), -(worker * 100_000 + index), dtype=np.int32)
            b = np.ones((1, 16), dtype=np.int32)
            tensors = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            tensors[0].set_data_from_numpy(a)
            tensors[1].set_data_from_numpy(b)
            result = client.infer("simple", tensors)
            with tally.lock:
                tally.valid += 1
                if not np.array_equal(result.as_numpy("OUTPUT1"), a - b):
                    tally.wrong.append(f"grpc worker {worker} request {index}")

        _for(SECONDS, step)
        client.close()

    def invalid_http(worker: int) -> None:
        bodies = [
            (b"{not json", {}),
            (WRONG_SHAPE, {}),
            (b"x" * 70_000, {}),  # over the size limit
            (b"{}", {"Inference-Header-Content-Length": "abc"}),
        ]

        def step(index: int) -> None:
            body, headers = bodies[index % len(bodies)]
            status, _, _ = server.request("POST", "/v2/models/simple/infer", body, headers)
            tally.status(status)
            if not 400 <= status < 500:
                with tally.lock:
                    tally.wrong.append(f"invalid request answered {status}")

        _for(SECONDS, step)

    abandoned = [0]

    def abandoning(worker: int) -> None:
        body = json.dumps(
            {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32",
                         "data": [1, 2, 3, 4]}]}
        ).encode()
        head = (
            f"POST /v2/models/queued/infer HTTP/1.1\r\nHost: x\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()

        def step(index: int) -> None:
            with socket.create_connection(("127.0.0.1", server.port or 0)) as sock:
                sock.sendall(head + body)
                time.sleep(0.05)
            with tally.lock:
                abandoned[0] += 1

        _for(SECONDS, step)

    workers = [
        threading.Thread(target=valid_http, args=(0,)),
        threading.Thread(target=valid_http, args=(1,)),
        threading.Thread(target=valid_grpc, args=(2,)),
        threading.Thread(target=invalid_http, args=(3,)),
        threading.Thread(target=abandoning, args=(4,)),
    ]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(60)
    assert not tally.wrong, tally.wrong[:5]
    assert tally.valid > 50 and abandoned[0] > 5, (tally.valid, abandoned)

    stats = json.loads(server.request("GET", "/v2/models/simple/stats")[2])["model_stats"][0]
    assert stats["inference_stats"]["success"]["count"] == tally.valid
    time.sleep(0.5)  # the last abandoned request's disconnect reaches the server
    queued = json.loads(server.request("GET", "/v2/models/queued/stats")[2])["model_stats"][0]
    assert queued["execution_count"] == 0, "an abandoned request ran"
    assert queued["inference_stats"]["fail"]["count"] == abandoned[0]
    assert server.request("GET", "/v2/health/ready")[0] == 200
    assert "Traceback" not in server.log and "internal error" not in server.log, server.log[-3000:]

