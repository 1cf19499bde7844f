"""The dynamic batcher under load on the real server (issue 5): hundreds of concurrent
requests of mixed batch sizes over HTTP and gRPC at once to the example MLP with dynamic
batching and two instances. Every reply equals a direct ONNX Runtime run of that request
alone (no answer mixed up with another request's rows, none lost), and the statistics show
that requests were really batched, with every row counted once."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from scripts import make_models
from tests.server_process import ServerProcess, start_server

MODEL = "mlp"
INPUTS = 256
OUTPUTS = 10
MAX_BATCH = 32
HTTP_REQUESTS = 150
GRPC_REQUESTS = 150
CONFIG = f"""name: "{MODEL}"
platform: "onnxruntime_onnx"
max_batch_size: {MAX_BATCH}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {INPUTS} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {OUTPUTS} ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
instance_group [ {{ kind: KIND_CPU count: 2 }} ]
"""


@pytest.fixture(scope="module")
def model_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("batching_repo")
    path = root / MODEL / "1" / "model.onnx"
    make_models.save(make_models.mlp(INPUTS, 256, OUTPUTS), path)
    make_models.write_text(CONFIG, root / MODEL / "config.pbtxt")
    return path


@pytest.fixture(scope="module")
def server(model_file: Path) -> Iterator[ServerProcess]:
    process = start_server(model_file.parent.parent.parent)
    assert process.port is not None and process.grpc_port is not None, process.log
    yield process
    process.stop()


def _requests(count: int, seed: int) -> list[np.ndarray]:
    """``count`` requests of 1 to 4 rows of random data (distinct for every request)."""
    rng = np.random.default_rng(seed)
    return [
        rng.standard_normal((int(rng.integers(1, 5)), INPUTS)).astype(np.float32)
        for _ in range(count)
    ]


def _reference(model_file: Path, requests: list[np.ndarray]) -> list[np.ndarray]:
    """Each request run alone, directly on ONNX Runtime."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(
        str(model_file), options, providers=["CPUExecutionProvider"]
    )
    return [session.run(["OUTPUT0"], {"INPUT0": x})[0] for x in requests]


def _send_grpc(
    client: grpcclient.InferenceServerClient, requests: list[np.ndarray]
) -> tuple[threading.Event, list[Any], list[Any]]:
    """Fire every request at once; the event is set when all have answered."""
    answers: list[Any] = [None] * len(requests)
    errors: list[Any] = [None] * len(requests)
    done = threading.Event()
    remaining = [len(requests)]
    lock = threading.Lock()

    def callback(index: int, result: Any, error: Any) -> None:
        answers[index] = None if result is None else result.as_numpy("OUTPUT0")
        errors[index] = error
        with lock:
            remaining[0] -= 1
            if remaining[0] == 0:
                done.set()

    for index, x in enumerate(requests):
        tensor = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x)
        client.async_infer(
            MODEL,
            [tensor],
            callback=lambda result, error, index=index: callback(index, result, error),
            outputs=[grpcclient.InferRequestedOutput("OUTPUT0")],
            request_id=f"grpc-{index}",
        )
    return done, answers, errors


def _send_http(
    client: httpclient.InferenceServerClient, requests: list[np.ndarray]
) -> list[np.ndarray]:
    pending = []
    for index, x in enumerate(requests):
        tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        tensor.set_data_from_numpy(x, binary_data=True)
        pending.append(
            client.async_infer(
                MODEL,
                [tensor],
                outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)],
                request_id=f"http-{index}",
            )
        )
    return [request.get_result(timeout=60).as_numpy("OUTPUT0") for request in pending]


def test_concurrent_mixed_batches_get_their_own_answers_and_are_batched(
    server: ServerProcess, model_file: Path
) -> None:
    http_requests = _requests(HTTP_REQUESTS, seed=1)
    grpc_requests = _requests(GRPC_REQUESTS, seed=2)
    http_expected = _reference(model_file, http_requests)
    grpc_expected = _reference(model_file, grpc_requests)

    grpc_client = grpcclient.InferenceServerClient(server.grpc_url)
    http_client = httpclient.InferenceServerClient(server.url, concurrency=32)
    try:
        # Both transports at once: the gRPC calls are in flight while HTTP sends its own.
        grpc_done, grpc_answers, grpc_errors = _send_grpc(grpc_client, grpc_requests)
        http_answers = _send_http(http_client, http_requests)
        assert grpc_done.wait(60), "some gRPC requests never answered"
    finally:
        http_client.close()
        grpc_client.close()

    assert [e for e in grpc_errors if e is not None] == []
    for transport, answers, expected in (
        ("http", http_answers, http_expected),
        ("grpc", grpc_answers, grpc_expected),
    ):
        assert len(answers) == len(expected)
        for index, (answer, want) in enumerate(zip(answers, expected, strict=True)):
            assert answer is not None, f"{transport} request {index} lost"
            assert answer.shape == want.shape, f"{transport} request {index}"
            np.testing.assert_allclose(
                answer, want, rtol=1e-5, atol=1e-6, err_msg=f"{transport} request {index}"
            )

    status, _, body = server.request("GET", f"/v2/models/{MODEL}/stats")
    assert status == 200, body
    (stats,) = json.loads(body)["model_stats"]
    requests = HTTP_REQUESTS + GRPC_REQUESTS
    rows = sum(len(x) for x in http_requests + grpc_requests)
    batches = {
        entry["batch_size"]: entry["compute_infer"]["count"] for entry in stats["batch_stats"]
    }
    assert stats["inference_count"] == rows
    assert stats["inference_stats"]["success"]["count"] == requests
    assert stats["inference_stats"]["fail"]["count"] == 0
    assert stats["execution_count"] < requests, batches
    assert max(batches) > 1, batches
    assert max(batches) <= MAX_BATCH, batches
    assert sum(batches.values()) == stats["execution_count"], batches
    assert sum(size * count for size, count in batches.items()) == rows, batches
