"""The HTTP server end to end on the GPU path, with results compared to a CPU run, and batched
execution through CuPy device buffers.

``python -m server`` (through ``server_http``) serves python-backend models that
compute the same thing, ``y = 2 * x + 1`` on FP32 (exact in FP32, fused or not: ``2 * x`` is
exact), on a KIND_GPU instance (CuPy arrays, checked inside ``execute``) and on a KIND_CPU one
(numpy). Binary-data HTTP requests go to both and the answers must be identical: one 16 MiB
request to the non-batching pair, and a burst of concurrent small requests to the batching pair,
where every answer must match its own input (no rows of another request) and at least one
execution must have seen rows of several requests (``ROWS``, the row count ``execute`` was given,
is returned with every row). Runs only where CuPy sees a device (see ``conftest.py``).
"""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import server_http

from tests.server_process import ServerProcess

BURST = 16  # concurrent requests to the batching models
BIG_ELEMENTS = (16 << 20) // 4  # one 16 MiB FP32 tensor

BATCHED_CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }} ]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: 20000 }}
instance_group [ {{ {group} }} ]
"""

# On KIND_GPU: the input must be a CuPy array on device 0, with a stream of the instance's own
# current (not the legacy default one); the outputs are CuPy arrays. The short sleep holds the
# one instance busy, so that requests of a burst queue up behind it and are batched.
GPU_MODEL = '''"""y = 2x + 1 on the device; ROWS = the rows this execution was given."""

import time

import cupy


class TensorgateModel:
    def initialize(self, config):
        assert config["_instance"] == {"kind": "KIND_GPU", "device_id": 0}, config["_instance"]

    def execute(self, inputs):
        x = inputs["INPUT0"]
        assert isinstance(x, cupy.ndarray), type(x)
        assert x.dtype == cupy.float32, x.dtype
        assert x.device.id == 0, x.device
        assert cupy.cuda.Device().id == 0
        assert cupy.cuda.get_current_stream().ptr != 0, "the legacy default stream is current"
        y = x * x.dtype.type(2) + x.dtype.type(1)
        result = {"OUTPUT0": y}
        if x.ndim == 2:  # the batching model
            time.sleep(0.01)
            result["ROWS"] = cupy.full((x.shape[0], 1), x.shape[0], dtype=cupy.int32)
        return result
'''
CPU_MODEL = '''"""y = 2x + 1 on the host; ROWS = the rows this execution was given."""

import numpy as np


class TensorgateModel:
    def execute(self, inputs):
        x = inputs["INPUT0"]
        assert isinstance(x, np.ndarray), type(x)
        y = x * x.dtype.type(2) + x.dtype.type(1)
        result = {"OUTPUT0": y}
        if x.ndim == 2:
            result["ROWS"] = np.full((x.shape[0], 1), x.shape[0], dtype=np.int32)
        return result
'''


# name: (config template, instance group, code)
MODELS = {
    "affine_gpu": (BATCHED_CONFIG, server_http.GPU_GROUP, GPU_MODEL),
    "affine_cpu": (BATCHED_CONFIG, server_http.CPU_GROUP, CPU_MODEL),
    "big_gpu": (server_http.VECTOR_CONFIG, server_http.GPU_GROUP, GPU_MODEL),
    "big_cpu": (server_http.VECTOR_CONFIG, server_http.CPU_GROUP, CPU_MODEL),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("gpu_path_repo")
    for name, (config, group, code) in MODELS.items():
        server_http.write_model(root, name, config.format(name=name, group=group), code)
    with server_http.serving(root, MODELS) as process:
        yield process


@pytest.fixture(autouse=True)
def still_serving(server: ServerProcess) -> Iterator[None]:
    """After every test: the server process is alive and ready."""
    yield
    server_http.assert_serving(server)


def _infer(
    server: ServerProcess,
    model: str,
    x: np.ndarray,
    outputs: list[str],
    connection: http.client.HTTPConnection | None = None,
) -> dict[str, np.ndarray]:
    """The outputs of the 200 answer to a binary-data request: INPUT0 = ``x``, and
    ``outputs`` asked for as binary data."""
    status, header_length, answer = server_http.post_infer(
        server, model, list(x.shape), {"binary_data_size": x.nbytes},
        {name: {"binary_data": True} for name in outputs}, x, connection,
    )
    assert status == 200, (model, answer[:2000], server.log[-4000:])
    return server_http.binary_outputs(header_length, answer)


def _stats(server: ServerProcess, model: str) -> tuple[int, int]:
    """(inference_count, execution_count) of the model's statistics."""
    status, _, body = server_http.request(server, "GET", f"/v2/models/{model}/stats")
    assert status == 200, body
    (entry,) = json.loads(body)["model_stats"]
    return int(entry["inference_count"]), int(entry["execution_count"])


def test_small_request_matches_the_cpu(server: ServerProcess) -> None:
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    gpu = _infer(server, "affine_gpu", x, ["OUTPUT0", "ROWS"])
    cpu = _infer(server, "affine_cpu", x, ["OUTPUT0", "ROWS"])
    assert gpu["OUTPUT0"].shape == (3, 16)
    np.testing.assert_array_equal(gpu["OUTPUT0"], cpu["OUTPUT0"])
    np.testing.assert_array_equal(gpu["OUTPUT0"], server_http.affine(x))
    # Alone, the request is its own batch.
    np.testing.assert_array_equal(gpu["ROWS"], np.full((3, 1), 3, np.int32))


def test_16_mib_request_matches_the_cpu(server: ServerProcess) -> None:
    x = np.random.default_rng(2).standard_normal(BIG_ELEMENTS).astype(np.float32)
    x[:4] = [0.0, -0.0, 1e30, -1e-30]  # signed zero and extremes survive the round trip
    gpu = _infer(server, "big_gpu", x, ["OUTPUT0"])["OUTPUT0"]
    cpu = _infer(server, "big_cpu", x, ["OUTPUT0"])["OUTPUT0"]
    assert gpu.shape == cpu.shape == (BIG_ELEMENTS,)
    np.testing.assert_array_equal(gpu, cpu)
    np.testing.assert_array_equal(gpu, server_http.affine(x))
    # Twice in a row on one connection: the second answer is not the first one's buffers.
    y = x[::-1].copy()
    conn = server_http.connect(server)
    try:
        first = _infer(server, "big_gpu", x, ["OUTPUT0"], conn)["OUTPUT0"]
        second = _infer(server, "big_gpu", y, ["OUTPUT0"], conn)["OUTPUT0"]
    finally:
        conn.close()
    np.testing.assert_array_equal(first, server_http.affine(x))
    np.testing.assert_array_equal(second, server_http.affine(y))


def _burst(server: ServerProcess, model: str, inputs: list[np.ndarray]) -> list[Any]:
    """Send every input at once, one thread and one connection each (all connected before
    any sends); the answers, or the exception a thread met, in input order."""
    results: list[Any] = [None] * len(inputs)
    connections = [server_http.connect(server) for _ in inputs]
    start = threading.Barrier(len(inputs), timeout=server_http.TIMEOUT_S)

    def send(index: int) -> None:
        try:
            connections[index].connect()
            start.wait()
            results[index] = _infer(
                server, model, inputs[index], ["OUTPUT0", "ROWS"], connections[index]
            )
        except BaseException as exc:  # noqa: BLE001 - reported by the test thread
            results[index] = exc
            start.abort()

    threads = [threading.Thread(target=send, args=(i,), daemon=True) for i in range(len(inputs))]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(server_http.TIMEOUT_S * 2)
        assert not any(thread.is_alive() for thread in threads), "a request did not finish"
    finally:
        for conn in connections:
            conn.close()
    return results


def test_concurrent_requests_are_batched_on_the_device(server: ServerProcess) -> None:
    # Request i has 1 or 2 rows, every element distinct across the burst: a row of another
    # request in an answer shows up as a mismatch.
    rows = [1 + i % 2 for i in range(BURST)]
    base = np.arange(16, dtype=np.float32) / 16
    inputs = [
        np.stack([base + np.float32(100 * i + r) for r in range(rows[i])]).astype(np.float32)
        for i in range(BURST)
    ]
    count_before, executions_before = _stats(server, "affine_gpu")
    results = _burst(server, "affine_gpu", inputs)
    errors = [r for r in results if isinstance(r, BaseException)]
    assert not errors, (errors, server.log[-4000:])
    joined = []  # (the request's rows, the rows of the execution that ran it)
    for x, answer in zip(inputs, results, strict=True):
        np.testing.assert_array_equal(answer["OUTPUT0"], server_http.affine(x))
        executed = answer["ROWS"]
        assert executed.shape == (x.shape[0], 1)
        assert (executed == executed[0, 0]).all(), executed  # one execution per request
        assert x.shape[0] <= executed[0, 0] <= 8, executed
        joined.append((x.shape[0], int(executed[0, 0])))
    # At least one execution held more rows than the request itself: several requests.
    assert any(total > own for own, total in joined), f"nothing was batched: {joined}"
    count_after, executions_after = _stats(server, "affine_gpu")
    assert count_after - count_before == sum(rows)
    assert executions_after - executions_before < BURST

    # The same inputs, one at a time, on the CPU instance: the same answers.
    for x, answer in zip(inputs, results, strict=True):
        cpu = _infer(server, "affine_cpu", x, ["OUTPUT0"])["OUTPUT0"]
        np.testing.assert_array_equal(answer["OUTPUT0"], cpu)


def test_bursts_of_the_cpu_and_gpu_models_agree(server: ServerProcess) -> None:
    """The same random burst to both batching models, at once on each: row for row equal."""
    rng = np.random.default_rng(3)
    inputs = [
        rng.standard_normal((1 + i % 3, 16)).astype(np.float32) for i in range(BURST)
    ]
    gpu = _burst(server, "affine_gpu", inputs)
    cpu = _burst(server, "affine_cpu", inputs)
    for x, on_gpu, on_cpu in zip(inputs, gpu, cpu, strict=True):
        assert not isinstance(on_gpu, BaseException), (on_gpu, server.log[-4000:])
        assert not isinstance(on_cpu, BaseException), (on_cpu, server.log[-4000:])
        np.testing.assert_array_equal(on_gpu["OUTPUT0"], on_cpu["OUTPUT0"])
        np.testing.assert_array_equal(on_gpu["OUTPUT0"], server_http.affine(x))


def test_a_wrong_request_leaves_the_gpu_model_serving(server: ServerProcess) -> None:
    """A request the server refuses (too many rows for max_batch_size 8) is a 400; the GPU
    instance answers the next one."""
    x = np.zeros((9, 16), np.float32)
    status, _, answer = server_http.post_infer(
        server, "affine_gpu", list(x.shape), {"binary_data_size": x.nbytes},
        {"OUTPUT0": {"binary_data": True}}, x,
    )
    assert status == 400, answer
    x = np.ones((1, 16), np.float32)
    np.testing.assert_array_equal(_infer(server, "affine_gpu", x, ["OUTPUT0"])["OUTPUT0"],
                                  server_http.affine(x))
