"""/metrics on the real server: every family present, counters moving by exactly the requests
sent, each failure counted under its reason (queue full → REJECTED, a model fault → BACKEND,
a bad request → OTHER, a client gone while queued → CANCELED), the statistics extension
agreeing, histograms on request, and the endpoint off when asked."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from scripts import make_models
from tests.model_repos import rows_of_three_model
from tests.server_process import ServerProcess, start_server

FAMILIES = (
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_pending_request_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "nv_inference_compute_input_duration_us",
    "nv_inference_compute_infer_duration_us",
    "nv_inference_compute_output_duration_us",
    "nv_model_load_duration_secs",
    "nv_cpu_utilization",
    "nv_cpu_memory_total_bytes",
    "nv_cpu_memory_used_bytes",
    "nv_pinned_memory_pool_total_bytes",
    "nv_pinned_memory_pool_used_bytes",
)
# A request waits up to 1 s for a batch of 8 that never comes; one at a time may wait.
QUEUED_CONFIG = """max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching {
  preferred_batch_size: [ 8 ]
  max_queue_delay_microseconds: 1000000
  default_queue_policy { max_queue_size: 1 }
}
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("metrics_repo")
    identity = make_models.identity("FP32", ["batch", 4])
    make_models.save(identity, root / "plain" / "1" / "model.onnx")
    make_models.save(identity, root / "queued" / "1" / "model.onnx")
    make_models.write_text(QUEUED_CONFIG, root / "queued" / "config.pbtxt")
    make_models.save(rows_of_three_model(), root / "rows_of_three" / "1" / "model.onnx")
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    process = start_server(repository, args=("--metrics-config=histogram_latencies=true",))
    assert process.metrics_port is not None, process.log
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def still_serving(server: ServerProcess) -> Iterator[None]:
    """After every test, the refusals included: a good request to ``plain`` is answered with
    its data and counted once. It runs after the test, and the tests assert only what moved
    between their own before and after, so it changes nothing they check."""
    yield
    plain = _labels("plain")
    before = _samples(server).get(("nv_inference_request_success_total", plain), 0.0)
    values = [1.5, -2.0, 3.25, 4.0]
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": values}]}
    status, _, text = server.request("POST", "/v2/models/plain/infer", json.dumps(body).encode())
    assert status == 200, text
    (output,) = json.loads(text)["outputs"]
    assert (output["name"], output["shape"], output["data"]) == ("OUTPUT0", [1, 4], values)
    assert _samples(server)[("nv_inference_request_success_total", plain)] == before + 1


def _samples(server: ServerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(server.metrics()):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def _labels(model: str, reason: str | None = None) -> tuple[tuple[str, str], ...]:
    pairs = [("model", model), ("version", "1")]
    if reason is not None:
        pairs.append(("reason", reason))
    return tuple(sorted(pairs))


def _infer(
    server: ServerProcess, model: str, values: list[float], rows: int = 1, output: str = ""
) -> int:
    body: dict[str, object] = {
        "inputs": [
            {"name": "INPUT0", "shape": [rows, len(values) // rows], "datatype": "FP32",
             "data": values}
        ]
    }
    if output:
        body["outputs"] = [{"name": output}]
    status, _, _ = server.request("POST", f"/v2/models/{model}/infer", json.dumps(body).encode())
    return status


def test_every_family_is_there(server: ServerProcess) -> None:
    names = {family.name for family in text_string_to_metric_families(server.metrics())}
    for family in FAMILIES:
        assert family in names, family
    assert "nv_inference_request_duration_histogram_us" in names


def test_counters_move_by_exactly_the_requests_sent(server: ServerProcess) -> None:
    before = _samples(server)
    for _ in range(5):
        assert _infer(server, "plain", [1.0, 2.0, 3.0, 4.0]) == 200
    assert _infer(server, "plain", [1.0] * 12, rows=3) == 200
    after = _samples(server)
    plain = _labels("plain")

    def moved(name: str) -> float:
        return after[(name, plain)] - before.get((name, plain), 0.0)

    assert moved("nv_inference_request_success_total") == 6
    assert moved("nv_inference_count_total") == 8
    assert moved("nv_inference_exec_count_total") == 6
    assert moved("nv_inference_request_duration_us_total") > 0
    assert moved("nv_inference_request_duration_histogram_us_count") == 6
    status, _, body = server.request("GET", "/v2/models/plain/stats")
    assert status == 200, body
    (stats,) = json.loads(body)["model_stats"]
    assert stats["inference_stats"]["success"]["count"] == after[
        ("nv_inference_request_success_total", plain)
    ]
    assert stats["inference_count"] == after[("nv_inference_count_total", plain)]
    assert stats["execution_count"] == after[("nv_inference_exec_count_total", plain)]
    assert stats["inference_stats"]["queue"]["ns"] // 1000 == after[
        ("nv_inference_queue_duration_us_total", plain)
    ]


def test_failures_are_counted_under_their_reasons(server: ServerProcess) -> None:
    before = _samples(server)
    # OTHER: a request the model refuses (an output it does not have)
    assert _infer(server, "plain", [1.0, 2.0, 3.0, 4.0], output="NOPE") == 400
    # BACKEND: ONNX Runtime fails inside the model (4 elements are not rows of 3)
    assert _infer(server, "rows_of_three", [1.0, 2.0, 3.0, 4.0]) == 500
    # REJECTED: the queue holds one request; a second one while it waits is turned away
    with ThreadPoolExecutor(1) as pool:
        waiting = pool.submit(_infer, server, "queued", [1.0, 2.0, 3.0, 4.0])
        deadline = time.monotonic() + 5
        while _samples(server)[("nv_inference_pending_request_count", _labels("queued"))] < 1:
            assert time.monotonic() < deadline, "the first request never queued"
            time.sleep(0.02)
        assert _infer(server, "queued", [1.0, 2.0, 3.0, 4.0]) == 503
        assert waiting.result(timeout=10) == 200
    after = _samples(server)

    def moved(model: str, reason: str) -> float:
        key = ("nv_inference_request_failure_total", _labels(model, reason))
        return after[key] - before.get(key, 0.0)

    assert moved("plain", "OTHER") == 1
    assert moved("rows_of_three", "BACKEND") == 1
    assert moved("queued", "REJECTED") == 1
    assert moved("queued", "CANCELED") == 0
    assert after[("nv_inference_pending_request_count", _labels("queued"))] == 0


def test_a_client_gone_while_queued_counts_as_canceled(server: ServerProcess) -> None:
    key = ("nv_inference_request_failure_total", _labels("queued", "CANCELED"))
    before = _samples(server).get(key, 0.0)
    text = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}
    ).encode()
    request = (
        f"POST /v2/models/queued/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(text)}\r\n\r\n"
    ).encode() + text
    assert server.port is not None
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(request)
        deadline = time.monotonic() + 5
        while _samples(server)[("nv_inference_pending_request_count", _labels("queued"))] < 1:
            assert time.monotonic() < deadline, "the request never queued"
            time.sleep(0.02)
    deadline = time.monotonic() + 5
    while _samples(server).get(key, 0.0) < before + 1:
        assert time.monotonic() < deadline, "the cancelled request was not counted"
        time.sleep(0.05)
    assert _samples(server)[key] == before + 1


def test_other_methods_and_paths(server: ServerProcess) -> None:
    import http.client

    assert server.metrics_port is not None
    for method, path, status in (("POST", "/metrics", 405), ("GET", "/other", 404)):
        connection = http.client.HTTPConnection("127.0.0.1", server.metrics_port, timeout=10)
        connection.request(method, path)
        assert connection.getresponse().status == status
        connection.close()


def test_metrics_can_be_switched_off(repository: Path) -> None:
    process = start_server(repository, args=("--allow-metrics=false",))
    try:
        assert process.port is not None, process.log
        assert process.metrics_port is None
        assert "Metrics Service" not in process.log
        # the server without metrics serves as usual
        data = [1.0, 2.0, 3.0, 4.0]
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": data}]}
        status, _, text = process.request(
            "POST", "/v2/models/plain/infer", json.dumps(body).encode()
        )
        assert status == 200, text
        assert json.loads(text)["outputs"][0]["data"] == data
    finally:
        process.stop()
