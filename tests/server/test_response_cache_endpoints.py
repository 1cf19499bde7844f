"""The response cache on the real server (either process layout, ``TENSORGATE_TEST_FRONTENDS``):
a repeated request is answered without running the model and counted as Triton 2.51 counts
it (triton-features §2.2), over HTTP and gRPC alike, and ``/metrics`` shows the nv_cache
families; without ``--cache-config`` a model enabling the cache loads with a warning and
nothing is cached."""

from __future__ import annotations

import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.server_process import EXAMPLES, ServerProcess, start_server

CACHE_SIZE = 1 << 20
NO_CACHE_WARNING = (
    "model 'simple' enables the response cache, but no cache is configured "
    "(--cache-config local,size=BYTES): its responses are not cached"
)


_INT16 = "data_type: TYPE_INT32 dims: [ 16 ]"
# One step through ``plain`` (which does not cache): the ensemble caches as a whole.
ENSEMBLE = f"""name: "ens"
platform: "ensemble"
max_batch_size: 8
input [ {{ name: "INPUT0" {_INT16} }}, {{ name: "INPUT1" {_INT16} }} ]
output [ {{ name: "OUTPUT0" {_INT16} }}, {{ name: "OUTPUT1" {_INT16} }} ]
ensemble_scheduling {{ step [
  {{ model_name: "plain" model_version: -1
    input_map {{ key: "INPUT0" value: "INPUT0" }} input_map {{ key: "INPUT1" value: "INPUT1" }}
    output_map {{ key: "OUTPUT0" value: "OUTPUT0" }}
    output_map {{ key: "OUTPUT1" value: "OUTPUT1" }} }}
] }}
response_cache {{ enable: true }}
"""


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``simple`` with the cache enabled, and ``plain``: the same model without it."""
    root = tmp_path_factory.mktemp("cache_repo")
    shutil.copytree(EXAMPLES / "simple", root / "simple")
    config = root / "simple" / "config.pbtxt"
    config.write_text(config.read_text() + "response_cache { enable: true }\n")
    shutil.copytree(EXAMPLES / "simple", root / "plain")
    plain = root / "plain" / "config.pbtxt"
    plain.write_text(plain.read_text().replace('name: "simple"', 'name: "plain"'))
    (root / "ens" / "1").mkdir(parents=True)
    (root / "ens" / "config.pbtxt").write_text(ENSEMBLE)
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    process = start_server(repo, args=(f"--cache-config=local,size={CACHE_SIZE}",))
    assert process.port is not None, process.log
    yield process
    assert process.stop() == 0


def _infer(server: ServerProcess, model: str, first: int, rows: int = 1) -> dict[str, Any]:
    data = (np.arange(16 * rows, dtype=np.int32) + first).reshape(rows, 16)
    body = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [rows, 16], "data": data.tolist()},
            {"name": "INPUT1", "datatype": "INT32", "shape": [rows, 16],
             "data": np.ones_like(data).tolist()},
        ]
    }
    status, _, reply = server.request(
        "POST", f"/v2/models/{model}/infer", json.dumps(body).encode()
    )
    assert status == 200, reply
    answer: dict[str, Any] = json.loads(reply)
    outputs = {o["name"]: o["data"] for o in answer["outputs"]}
    assert outputs["OUTPUT0"] == (data + 1).reshape(-1).tolist()
    assert outputs["OUTPUT1"] == (data - 1).reshape(-1).tolist()
    return answer


def _stats(server: ServerProcess, model: str) -> dict[str, Any]:
    status, _, body = server.request("GET", f"/v2/models/{model}/stats")
    assert status == 200, body
    (stats,) = json.loads(body)["model_stats"]
    return stats  # type: ignore[no-any-return]


def _counts(stats: dict[str, Any]) -> dict[str, int]:
    infer = stats["inference_stats"]
    return {
        "success": infer["success"]["count"],
        "queue": infer["queue"]["count"],
        "compute_infer": infer["compute_infer"]["count"],
        "cache_hit": infer["cache_hit"]["count"],
        "cache_miss": infer["cache_miss"]["count"],
        "inference_count": stats["inference_count"],
        "execution_count": stats["execution_count"],
    }


def _delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: after[k] - before[k] for k in before}


def test_a_repeated_request_is_a_hit_and_another_a_miss(server: ServerProcess) -> None:
    before = _counts(_stats(server, "simple"))
    _infer(server, "simple", 100)
    after_miss = _counts(_stats(server, "simple"))
    assert _delta(before, after_miss) == {
        "success": 1, "queue": 1, "compute_infer": 1, "cache_hit": 0, "cache_miss": 1,
        "inference_count": 1, "execution_count": 1,
    }
    _infer(server, "simple", 100)
    after_hit = _counts(_stats(server, "simple"))
    # A hit is a success and is queued, but nothing runs (triton-features §2.2).
    assert _delta(after_miss, after_hit) == {
        "success": 1, "queue": 1, "compute_infer": 0, "cache_hit": 1, "cache_miss": 0,
        "inference_count": 0, "execution_count": 0,
    }
    _infer(server, "simple", 101)  # other bytes
    _infer(server, "simple", 100, rows=2)  # other shape (its first row is the same)
    after_others = _counts(_stats(server, "simple"))
    assert _delta(after_hit, after_others)["cache_miss"] == 2
    assert _delta(after_hit, after_others)["execution_count"] == 2
    stats = _stats(server, "simple")["inference_stats"]
    assert stats["cache_hit"]["ns"] > 0 and stats["cache_miss"]["ns"] > 0


def test_grpc_requests_share_the_cache_and_see_the_counts(server: ServerProcess) -> None:
    _infer(server, "simple", 500)  # a miss over HTTP
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        before = client.get_inference_statistics("simple").model_stats[0]
        data = (np.arange(16, dtype=np.int32) + 500).reshape(1, 16)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(data)
        inputs[1].set_data_from_numpy(np.ones_like(data))
        result = client.infer("simple", inputs)
        assert result.as_numpy("OUTPUT0").tolist() == (data + 1).tolist()
        after = client.get_inference_statistics("simple").model_stats[0]
    finally:
        client.close()
    assert after.inference_stats.cache_hit.count == before.inference_stats.cache_hit.count + 1
    assert after.execution_count == before.execution_count
    assert after.inference_stats.success.count == before.inference_stats.success.count + 1


def test_a_model_without_the_cache_enabled_always_runs(server: ServerProcess) -> None:
    _infer(server, "plain", 7)
    _infer(server, "plain", 7)
    counts = _counts(_stats(server, "plain"))
    assert counts["execution_count"] == 2 and counts["cache_hit"] == counts["cache_miss"] == 0


def test_an_ensemble_is_cached_as_a_whole(server: ServerProcess) -> None:
    before = _counts(_stats(server, "plain"))
    _infer(server, "ens", 42)
    _infer(server, "ens", 42)
    assert _delta(before, _counts(_stats(server, "plain")))["execution_count"] == 1
    counts = _counts(_stats(server, "ens"))
    assert (counts["cache_hit"], counts["cache_miss"], counts["success"]) == (1, 1, 2)


def _sample(page: str, name: str, labels: str = "") -> float:
    match = re.search(rf"^{name}{re.escape(labels)} (\S+)$", page, re.MULTILINE)
    assert match is not None, (name, page)
    return float(match.group(1))


def test_metrics_show_the_cache_counters(server: ServerProcess) -> None:
    _infer(server, "simple", 900)
    _infer(server, "simple", 900)
    page = server.metrics()
    stats = _stats(server, "simple")["inference_stats"]
    labels = '{model="simple",version="1"}'
    assert _sample(page, "nv_cache_num_hits_per_model", labels) == stats["cache_hit"]["count"]
    assert _sample(page, "nv_cache_num_misses_per_model", labels) == stats["cache_miss"]["count"]
    assert _sample(page, "nv_cache_hit_duration_per_model", labels) == (
        stats["cache_hit"]["ns"] // 1000
    )
    assert _sample(page, "nv_cache_miss_duration_per_model", labels) == (
        stats["cache_miss"]["ns"] // 1000
    )
    assert "# TYPE nv_cache_num_hits_per_model counter" in page
    assert _sample(page, "nv_cache_num_entries") >= 1
    assert 0 < _sample(page, "nv_cache_util") < 1
    # Hits are successes but not inferences or executions (triton-facts §5.1).
    assert _sample(page, "nv_inference_request_success", labels) == (
        stats["success"]["count"]
    )
    full = _stats(server, "simple")
    assert _sample(page, "nv_inference_exec_count", labels) == full["execution_count"]


def test_without_a_configured_cache_the_model_loads_with_a_warning_and_runs(repo: Path) -> None:
    process = start_server(repo)
    try:
        assert process.port is not None, process.log
        assert process.log.count(NO_CACHE_WARNING) == 1, process.log
        _infer(process, "simple", 3)
        _infer(process, "simple", 3)
        counts = _counts(_stats(process, "simple"))
        assert counts["execution_count"] == 2 and counts["cache_hit"] == 0
        assert counts["cache_miss"] == 0
        assert "nv_cache_" not in process.metrics()
    finally:
        assert process.stop() == 0


def test_a_reloaded_model_is_not_answered_from_what_its_previous_load_cached(
    repo: Path,
) -> None:
    process = start_server(
        repo,
        args=(f"--cache-config=local,size={CACHE_SIZE}", "--model-control-mode=explicit",
              "--load-model=simple"),
    )
    try:
        _infer(process, "simple", 7)
        _infer(process, "simple", 7)
        assert _counts(_stats(process, "simple"))["cache_hit"] == 1
        status, _, body = process.request("POST", "/v2/repository/models/simple/load", b"")
        assert status == 200, body
        _infer(process, "simple", 7)  # the new load runs it: its weights may differ
        counts = _counts(_stats(process, "simple"))
        assert (counts["cache_miss"], counts["cache_hit"], counts["execution_count"]) == (1, 0, 1)
        _infer(process, "simple", 7)
        assert _counts(_stats(process, "simple"))["cache_hit"] == 1
    finally:
        assert process.stop() == 0
