"""The statistics extension on the real server: ``GET /v2/models[/{m}[/versions/{v}]]/stats``
and gRPC ``ModelStatistics`` (also through ``tritonclient`` on both transports). After N
successful and K failed requests the counters match exactly, and every field perf_analyzer
reads is present and an integer (triton-facts §5.2, §0 item 6)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from google.protobuf import json_format
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from scripts import make_models
from tests.model_repos import rows_of_three_model
from tests.server.observability.stats_fields import DURATIONS, PERF_ANALYZER_DURATIONS
from tests.server_process import ServerProcess, start_server

BATCH_DURATIONS = ("compute_input", "compute_infer", "compute_output")

# The requests of test_counts_match_the_requests_sent: batch sizes of the successes (the first
# three over HTTP, the rest over gRPC) and shapes of the failures (fail inside the model).
SUCCESS_BATCHES = (1, 2, 3, 1, 4)
FAILURE_SHAPES = ((1, 2), (2, 2), (1, 4))




@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("stats_repo")
    make_models.save(rows_of_three_model(), root / "counted" / "1" / "model.onnx")
    make_models.write_text("max_batch_size: 8\n", root / "counted" / "config.pbtxt")
    identity = make_models.identity("FP32", ["batch", 4])
    make_models.save(identity, root / "ident" / "1" / "model.onnx")
    for version in (1, 2):
        make_models.save(identity, root / "multi" / str(version) / "model.onnx")
    make_models.write_text(
        "max_batch_size: 4\nversion_policy: { all: {} }\n", root / "multi" / "config.pbtxt"
    )
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    process = start_server(repo)
    assert process.port is not None, process.log
    yield process
    process.stop()


@pytest.fixture(autouse=True)
def still_serving(server: ServerProcess) -> Iterator[None]:
    """After every test, the refusals included: a good request is still answered. It goes to
    ``ident``, whose counts no test pins (``counted`` and ``multi`` are counted exactly), and
    after the test, so it moves nothing a test asserts."""
    yield
    data = [float(i) for i in range(8)]
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2, 4], "data": data}]}
    status, _, text = server.request("POST", "/v2/models/ident/infer", json.dumps(body).encode())
    assert status == 200, text
    (output,) = json.loads(text)["outputs"]
    assert (output["name"], output["shape"], output["data"]) == ("OUTPUT0", [2, 4], data)


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    client = httpclient.InferenceServerClient(server.url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def grpc_client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def stub(server: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(server.grpc_url) as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def _infer(client: Any, model: str, data: np.ndarray, version: str = "") -> np.ndarray:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("INPUT0", list(data.shape), "FP32")
    tensor.set_data_from_numpy(data)
    out: np.ndarray = client.infer(model, [tensor], model_version=version).as_numpy("OUTPUT0")
    return out


def _stats(server: ServerProcess, path: str) -> list[dict[str, Any]]:
    status, headers, body = server.request("GET", path)
    assert status == 200, body
    assert headers["Content-Type"].startswith("application/json")
    entries: list[dict[str, Any]] = json.loads(body)["model_stats"]
    return entries


def _grpc_stats(
    stub: service_pb2_grpc.GRPCInferenceServiceStub, name: str = "", version: str = ""
) -> list[dict[str, Any]]:
    """The gRPC answer as JSON with int64s as numbers and zero fields printed."""
    response = stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name=name, version=version))
    entries = []
    for message in response.model_stats:
        entry = json_format.MessageToDict(
            message, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
        )
        entries.append(_numbers(entry))
    return entries


def _numbers(value: Any) -> Any:
    """protobuf's JSON prints (u)int64 as strings: turn digit strings back into ints."""
    if isinstance(value, dict):
        return {k: _numbers(v) if k not in ("name", "version") else v for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    if isinstance(value, str) and value.isdigit():
        return int(value)
    return value


def _is_uint(value: object) -> bool:
    return type(value) is int and value >= 0


def _check_fields(entry: dict[str, Any]) -> None:
    """Every field perf_analyzer reads is there and a non-negative integer."""
    assert isinstance(entry["name"], str) and isinstance(entry["version"], str)
    for key in ("last_inference", "inference_count", "execution_count"):
        assert _is_uint(entry[key]), (key, entry)
    for key in DURATIONS:
        duration = entry["inference_stats"][key]
        assert _is_uint(duration["count"]) and _is_uint(duration["ns"]), (key, entry)
    assert isinstance(entry["batch_stats"], list)
    for batch in entry["batch_stats"]:
        assert _is_uint(batch["batch_size"]) and batch["batch_size"] > 0
        for key in BATCH_DURATIONS:
            assert _is_uint(batch[key]["count"]) and _is_uint(batch[key]["ns"]), (key, batch)


def _counts(entry: dict[str, Any]) -> dict[str, Any]:
    stats = entry["inference_stats"]
    return {
        "inference_count": entry["inference_count"],
        "execution_count": entry["execution_count"],
        **{key: stats[key]["count"] for key in DURATIONS},
        "batches": {
            b["batch_size"]: tuple(b[key]["count"] for key in BATCH_DURATIONS)
            for b in entry["batch_stats"]
        },
    }


def test_counts_match_the_requests_sent(
    server: ServerProcess,
    http: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    started_ms = time.time() * 1000
    for index, batch in enumerate(SUCCESS_BATCHES):
        client = http if index < 3 else grpc_client
        data = np.arange(batch * 3, dtype=np.float32).reshape(batch, 3)
        np.testing.assert_array_equal(_infer(client, "counted", data), data)
    for index, shape in enumerate(FAILURE_SHAPES):
        client = grpc_client if index == 1 else http
        with pytest.raises(InferenceServerException) as caught:
            _infer(client, "counted", np.ones(shape, np.float32))
        assert caught.value.status() == ("StatusCode.INTERNAL" if index == 1 else "500")
        message = caught.value.message()
        # the model's own failure (ONNX Runtime's Reshape), reported under the version
        assert message.startswith("model 'counted' version 1 failed: "), message
        assert "Reshape" in message, message
    # refused before reaching a version: counted nowhere
    with pytest.raises(InferenceServerException) as caught:
        _infer(http, "counted", np.ones((1, 3), np.float32), version="7")
    assert (caught.value.status(), caught.value.message()) == (
        "404", "Request for unknown model: 'counted' version 7 is not found"
    )

    expected = {
        "inference_count": sum(SUCCESS_BATCHES),
        "execution_count": len(SUCCESS_BATCHES),
        "success": len(SUCCESS_BATCHES),
        "fail": len(FAILURE_SHAPES),
        "queue": len(SUCCESS_BATCHES),
        "compute_input": len(SUCCESS_BATCHES),
        "compute_infer": len(SUCCESS_BATCHES),
        "compute_output": len(SUCCESS_BATCHES),
        "cache_hit": 0,
        "cache_miss": 0,
        "batches": {1: (2, 2, 2), 2: (1, 1, 1), 3: (1, 1, 1), 4: (1, 1, 1)},
    }
    answers = {
        "http model": _stats(server, "/v2/models/counted/stats"),
        "http version": _stats(server, "/v2/models/counted/versions/1/stats"),
        "http all": [e for e in _stats(server, "/v2/models/stats") if e["name"] == "counted"],
        "grpc model": _grpc_stats(stub, "counted"),
        "grpc version": _grpc_stats(stub, "counted", "1"),
        "grpc all": [e for e in _grpc_stats(stub) if e["name"] == "counted"],
    }
    for where, entries in answers.items():
        assert len(entries) == 1, (where, entries)
        (entry,) = entries
        assert (entry["name"], entry["version"]) == ("counted", "1"), where
        _check_fields(entry)
        assert _counts(entry) == expected, where
        stats = entry["inference_stats"]
        assert stats["success"]["ns"] > 0 and stats["fail"]["ns"] > 0, where
        assert stats["compute_infer"]["ns"] > 0, where
        assert stats["success"]["ns"] >= stats["compute_infer"]["ns"], where
        assert started_ms - 1000 <= entry["last_inference"] <= time.time() * 1000 + 1000, where


def test_every_field_perf_analyzer_reads_is_an_integer(
    server: ServerProcess, http: httpclient.InferenceServerClient
) -> None:
    _infer(http, "ident", np.ones((2, 4), np.float32))
    for entry in _stats(server, "/v2/models/stats"):  # includes never-used versions
        _check_fields(entry)
        for key in PERF_ANALYZER_DURATIONS:
            assert set(entry["inference_stats"][key]) >= {"count", "ns"}
    (entry,) = _stats(server, "/v2/models/ident/stats")
    assert entry["response_stats"] == {}  # not decoupled
    assert isinstance(entry["memory_usage"], list)
    assert entry["inference_count"] >= 2 and entry["last_inference"] > 0


def test_scopes_all_models_one_model_one_version(
    server: ServerProcess,
    http: httpclient.InferenceServerClient,
    grpc_client: grpcclient.InferenceServerClient,
    stub: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    data = np.ones((1, 4), np.float32)
    _infer(http, "multi", data, version="1")
    _infer(grpc_client, "multi", data, version="1")
    _infer(http, "multi", data, version="2")
    _infer(http, "multi", data)  # no version: the newest, 2

    every = _stats(server, "/v2/models/stats")
    assert {(e["name"], e["version"]) for e in every} >= {
        ("counted", "1"), ("ident", "1"), ("multi", "1"), ("multi", "2")
    }
    both = _stats(server, "/v2/models/multi/stats")
    assert [(e["version"], e["inference_stats"]["success"]["count"]) for e in both] == [
        ("1", 2), ("2", 2)
    ]
    for version, count in (("1", 2), ("2", 2)):
        (entry,) = _stats(server, f"/v2/models/multi/versions/{version}/stats")
        assert (entry["name"], entry["version"]) == ("multi", version)
        assert entry["inference_stats"]["success"]["count"] == count
        (grpc_entry,) = _grpc_stats(stub, "multi", version)
        assert grpc_entry["inference_stats"]["success"]["count"] == count
    assert [e["version"] for e in _grpc_stats(stub, "multi")] == ["1", "2"]


def test_unknown_model_is_400_and_unknown_version_404(
    server: ServerProcess, stub: service_pb2_grpc.GRPCInferenceServiceStub
) -> None:
    status, _, body = server.request("GET", "/v2/models/nope/stats")
    assert status == 400
    assert json.loads(body) == {"error": "Request for unknown model: 'nope' is not found"}
    status, _, body = server.request("GET", "/v2/models/nope/versions/1/stats")
    assert status == 400
    assert json.loads(body) == {"error": "Request for unknown model: 'nope' is not found"}
    status, _, body = server.request("GET", "/v2/models/ident/versions/9/stats")
    assert status == 404
    assert json.loads(body) == {
        "error": "Request for unknown model: 'ident' version 9 is not found"
    }
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="nope"))
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == "Request for unknown model: 'nope' is not found"
    with pytest.raises(grpc.RpcError) as caught:
        stub.ModelStatistics(service_pb2.ModelStatisticsRequest(name="ident", version="9"))
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND
    assert caught.value.details() == "Request for unknown model: 'ident' version 9 is not found"


def test_tritonclient_get_inference_statistics_on_both_transports(
    http: httpclient.InferenceServerClient, grpc_client: grpcclient.InferenceServerClient
) -> None:
    everything = http.get_inference_statistics()
    assert {e["name"] for e in everything["model_stats"]} >= {"counted", "ident", "multi"}
    one = http.get_inference_statistics("multi", "2")
    assert [(e["name"], e["version"]) for e in one["model_stats"]] == [("multi", "2")]

    message = grpc_client.get_inference_statistics("multi", "1")
    assert [(s.name, s.version) for s in message.model_stats] == [("multi", "1")]
    as_json = grpc_client.get_inference_statistics("ident", as_json=True)
    assert [s["name"] for s in as_json["model_stats"]] == ["ident"]

    for call in (http.get_inference_statistics, grpc_client.get_inference_statistics):
        with pytest.raises(InferenceServerException) as caught:
            call("nope")
        assert "Request for unknown model: 'nope' is not found" in caught.value.message()


def test_extensions_are_listed(http: httpclient.InferenceServerClient) -> None:
    extensions = http.get_server_metadata()["extensions"]
    assert "statistics" in extensions and "model_repository" in extensions
