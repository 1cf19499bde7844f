"""Ragged batching on the real server: requests of different lengths to a model with
``allow_ragged_batch``, a batch input and a batch output (Triton's ragged batching) share
executions, and each gets its own elements back in its own shape."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.model_repos import build_ragged_repository
from tests.server_process import ServerProcess, start_server

REQUESTS = 24


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = start_server(build_ragged_repository(tmp_path_factory.mktemp("ragged_repo")))
    assert process.port is not None, process.log
    yield process
    process.stop()


def _request(x: np.ndarray, outputs: tuple[str, ...]) -> dict[str, list[object]]:
    """``infer``/``async_infer`` keyword arguments sending ``x`` and asking for ``outputs``."""
    tensor = httpclient.InferInput("INPUT", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=True)
    wanted = [httpclient.InferRequestedOutput(name, binary_data=True) for name in outputs]
    return {"inputs": [tensor], "outputs": wanted}


def test_requests_of_different_lengths_share_batches(server: ServerProcess) -> None:
    rng = np.random.default_rng(3)
    requests = [
        rng.standard_normal((1, int(rng.integers(1, 9)))).astype(np.float32)
        for _ in range(REQUESTS)
    ]
    client = httpclient.InferenceServerClient(server.url, concurrency=REQUESTS)
    try:
        pending = [
            client.async_infer("ragged", **_request(x, ("OUTPUT", "LAST_END"))) for x in requests
        ]
        answers = [p.get_result(timeout=60) for p in pending]
    finally:
        client.close()
    last_ends = []
    for x, answer in zip(requests, answers, strict=True):
        output = answer.as_numpy("OUTPUT")
        assert output.shape == x.shape
        np.testing.assert_array_equal(output, 2 * x)
        (last_end,) = answer.as_numpy("LAST_END").ravel()
        assert last_end >= x.size, "the accumulated count includes the request's own elements"
        assert last_end <= sum(r.size for r in requests)
        last_ends.append(int(last_end))

    status, _, body = server.request("GET", "/v2/models/ragged/stats")
    assert status == 200, body
    (stats,) = json.loads(body)["model_stats"]
    sizes = {entry["batch_size"] for entry in stats["batch_stats"]}
    assert stats["inference_count"] == REQUESTS
    assert max(sizes) > 1, f"different lengths were never batched together: {sizes}"
    # Each batch's ENDS accumulates over its requests: only the first request of a batch sees
    # its own count; every later one (a batch above held several) sees more than its own.
    own = [last_end == x.size for x, last_end in zip(requests, last_ends, strict=True)]
    assert not all(own), f"every request saw only its own elements: {last_ends}"
    assert sum(own) == stats["execution_count"], (last_ends, stats["execution_count"])


def test_a_multi_row_request_gets_its_own_shape_back(server: ServerProcess) -> None:
    x = np.arange(10, dtype=np.float32).reshape(2, 5)
    client = httpclient.InferenceServerClient(server.url)
    try:
        answer = client.infer("ragged", **_request(x, ("OUTPUT",)))
    finally:
        client.close()
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT"), 2 * x)


def test_batch_inputs_are_not_request_inputs(server: ServerProcess) -> None:
    """ENDS is made by the server: metadata does not list it and a request may not send it."""
    status, _, body = server.request("GET", "/v2/models/ragged")
    assert status == 200, body
    assert [tensor["name"] for tensor in json.loads(body)["inputs"]] == ["INPUT"]
    request = {
        "inputs": [
            {"name": "INPUT", "shape": [1, 2], "datatype": "FP32", "data": [1, 2]},
            {"name": "ENDS", "shape": [1], "datatype": "INT32", "data": [2]},
        ]
    }
    status, _, body = server.request("POST", "/v2/models/ragged/infer", json.dumps(request))
    assert status == 400, body
    assert json.loads(body) == {"error": "unexpected inference input 'ENDS' for model 'ragged'"}
    # the refusal left the model serving: a good ragged request still gets its answer
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    client = httpclient.InferenceServerClient(server.url)
    try:
        answer = client.infer("ragged", **_request(x, ("OUTPUT", "LAST_END")))
    finally:
        client.close()
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT"), 2 * x)
    assert answer.as_numpy("LAST_END").ravel().tolist() == [2]


def test_a_lone_request_sees_its_own_element_count(server: ServerProcess) -> None:
    """Alone in its batch, a request's accumulated element count is exactly its own size."""
    x = np.arange(5, dtype=np.float32).reshape(1, 5)
    client = httpclient.InferenceServerClient(server.url)
    try:
        answer = client.infer("ragged", **_request(x, ("OUTPUT", "LAST_END")))
    finally:
        client.close()
    assert answer.as_numpy("LAST_END").ravel().tolist() == [5]
    np.testing.assert_array_equal(answer.as_numpy("OUTPUT"), 2 * x)
