"""Warmup in the real server: a model is READY with its warmup counted in the statistics, a
failing sample fails its load over the repository API, and stops the server at start with
``--exit-on-error=true``. Run in both process layouts (``TENSORGATE_TEST_FRONTENDS``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.server.repository.warmup_models import (
    SIMPLE_WARMUP,
    add_recorder,
    add_simple,
    add_warmup_file,
    calls,
    warmup_of,
)
from tests.server_process import ServerProcess, start_server

EXPLICIT = "--model-control-mode=explicit"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("warmup_repo")
    add_simple(root, "warm", SIMPLE_WARMUP.format(batch_size=2, count=3))
    add_recorder(root, "rec", warmup_of("w", batch_size=2, count=2), instances=2)
    folder = add_recorder(root, "bad", warmup_of("neg", "input_data_file: \"neg\""))
    add_warmup_file(folder, "neg", [-1] * 4)
    add_recorder(root, "nofile", warmup_of("w", "input_data_file: \"gone.bin\""))
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    process = start_server(repository, args=(EXPLICIT, "--load-model=warm", "--load-model=rec"))
    assert process.port is not None, process.log
    yield process
    process.stop()


def _json(server: ServerProcess, method: str, path: str) -> dict[str, object]:
    status, _, body = server.request(method, path)
    assert status == 200, body
    result = json.loads(body)
    assert isinstance(result, dict)
    return result


def _stats(server: ServerProcess, model: str) -> dict[str, object]:
    entries = _json(server, "GET", f"/v2/models/{model}/stats")["model_stats"]
    assert isinstance(entries, list) and len(entries) == 1
    entry = entries[0]
    assert isinstance(entry, dict)
    return entry


def _index(server: ServerProcess) -> dict[str, dict[str, str]]:
    status, _, body = server.request("POST", "/v2/repository/index")
    assert status == 200, body
    return {entry["name"]: entry for entry in json.loads(body)}


def test_warmup_is_counted_as_triton_counts_it(server: ServerProcess) -> None:
    # Triton 2.51, batch_size 2 count 3, never queried: 6 inferences, 3 executions, 6 successes
    stats = _stats(server, "warm")
    assert stats["inference_count"] == 6 and stats["execution_count"] == 3
    infer = stats["inference_stats"]
    assert isinstance(infer, dict)
    assert infer["success"]["count"] == 6 and infer["fail"]["count"] == 0
    batches = stats["batch_stats"]
    assert isinstance(batches, list) and [b["batch_size"] for b in batches] == [2]
    assert batches[0]["compute_infer"]["count"] == 3


def test_each_instance_ran_warmup_before_the_model_was_ready(
    server: ServerProcess, repository: Path
) -> None:
    assert server.request("GET", "/v2/models/rec/ready")[0] == 200
    seen = calls(repository / "rec")
    assert len(seen) == 4 and len({call["instance"] for call in seen}) == 2
    assert all(call["requests"] == 2 for call in seen)
    stats = _stats(server, "rec")
    assert stats["inference_count"] == 8 and stats["execution_count"] == 4
    # a request afterwards adds to the warmup's counts
    body = b'{"inputs":[{"name":"IN","datatype":"INT32","shape":[1,4],"data":[1,2,3,4]}]}'
    status, _, answer = server.request("POST", "/v2/models/rec/infer", body)
    assert status == 200 and b"[1,2,3,4]" in answer, answer
    assert len(calls(repository / "rec")) == 5
    assert _stats(server, "rec")["inference_count"] == 9


def test_a_failing_sample_fails_the_load_with_its_reason(server: ServerProcess) -> None:
    status, _, body = server.request("POST", "/v2/repository/models/bad/load")
    assert status == 400, body
    reason = "Invalid argument: failed to run warmup sample 'neg': negative input"
    assert reason in json.loads(body)["error"]
    entry = _index(server)["bad"]
    assert entry["state"] == "UNAVAILABLE" and entry["reason"] == reason
    assert server.request("GET", "/v2/models/bad/ready")[0] == 400
    assert server.request("GET", "/v2/models/warm/ready")[0] == 200


def test_a_missing_input_data_file_fails_the_load_naming_it(server: ServerProcess) -> None:
    status, _, body = server.request("POST", "/v2/repository/models/nofile/load")
    assert status == 400, body
    assert "input_data_file 'warmup/gone.bin'" in json.loads(body)["error"]
    assert "'warmup/gone.bin'" in _index(server)["nofile"]["reason"]


def test_a_failing_sample_stops_the_server_at_start_with_exit_on_error(tmp_path: Path) -> None:
    folder = add_recorder(tmp_path, "bad", warmup_of("neg", "input_data_file: \"neg\""))
    add_warmup_file(folder, "neg", [-1] * 4)
    server = start_server(tmp_path, args=("--exit-on-error=true",), timeout=60)
    try:
        assert server.wait_exit() != 0
        assert server.port is None
        assert "failed to run warmup sample 'neg': negative input" in server.log
    finally:
        server.stop()
