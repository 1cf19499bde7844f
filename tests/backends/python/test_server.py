"""Python models served by the real server: batched over HTTP, faults answered with 500 while
the server goes on, configs that show the backend, and the loads that must fail cleanly."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient

from scripts import make_models
from tests.server_process import ServerProcess, start_server

REQUESTS = 16

SCALE_CONFIG = """name: "scale"
backend: "python"
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "ROWS" data_type: TYPE_INT32 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 100000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
# OUTPUT0 = 2 * INPUT0; ROWS = the number of rows in the batch execute was given.
SCALE = """import numpy as np


class TensorgateModel:
    def initialize(self, config):
        self.factor = np.float32(2)

    def execute(self, inputs):
        x = inputs["INPUT0"]
        rows = np.full((x.shape[0], 1), x.shape[0], dtype=np.int32)
        return {"OUTPUT0": x * self.factor, "ROWS": rows}
"""
FAULTY_CONFIG = """name: "faulty"
backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2 ] } ]
"""
FAULTY = """import numpy as np


class TensorgateModel:
    def execute(self, inputs):
        x = inputs["INPUT0"]
        if (x < 0).any():
            raise ValueError("negative input")
        return {"OUTPUT0": x + np.float32(1)}
"""
GPU_CONFIG = FAULTY_CONFIG.replace('"faulty"', '"on_gpu"') + (
    "instance_group [ { kind: KIND_GPU gpus: [ 0 ] } ]\n"
)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("python_repo")
    for name, config, code in (
        ("scale", SCALE_CONFIG, SCALE),
        ("faulty", FAULTY_CONFIG, FAULTY),
        ("on_gpu", GPU_CONFIG, FAULTY),
    ):
        make_models.write_text(config, root / name / "config.pbtxt")
        make_models.write_text(code, root / name / "1" / "model.py")
    make_models.write_text(FAULTY, root / "no_config" / "1" / "model.py")
    make_models.save(
        make_models.identity("FP32", ["batch", -1]), root / "onnx_identity" / "1" / "model.onnx"
    )
    return root


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    # Without CUDA on any machine, so that the KIND_GPU model fails to load everywhere.
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TENSORGATE_DISABLE_CUDA", "1")
        process = start_server(repository, args=("--exit-on-error=false",))
    assert process.port is not None, process.log
    yield process
    process.stop()


def _json(server: ServerProcess, method: str, path: str, body: bytes | None = None) -> object:
    status, _, data = server.request(method, path, body)
    assert status == 200, data
    return json.loads(data)


def test_concurrent_requests_are_batched_and_each_gets_its_own_answer(
    server: ServerProcess,
) -> None:
    client = httpclient.InferenceServerClient(server.url, concurrency=REQUESTS)
    try:
        sent = []
        for index in range(REQUESTS):
            data = np.arange(4, dtype=np.float32).reshape(1, 4) + 10 * index
            tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
            tensor.set_data_from_numpy(data)
            sent.append((data, client.async_infer("scale", [tensor])))
        rows = []
        for data, pending in sent:
            result = pending.get_result()
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data * 2)
            assert result.as_numpy("OUTPUT0").dtype == np.float32
            rows.append(int(result.as_numpy("ROWS")[0, 0]))
    finally:
        client.close()
    assert max(rows) > 1, rows  # requests were run together in one execute
    stats = _json(server, "GET", "/v2/models/scale/stats")
    assert isinstance(stats, dict)
    model_stats = stats["model_stats"][0]
    assert model_stats["inference_count"] == REQUESTS
    assert model_stats["execution_count"] < REQUESTS


def test_a_model_fault_is_a_500_and_the_server_goes_on(server: ServerProcess) -> None:
    bad = b'{"inputs":[{"name":"INPUT0","datatype":"FP32","shape":[2],"data":[1,-1]}]}'
    status, _, body = server.request("POST", "/v2/models/faulty/infer", bad)
    assert status == 500, body
    assert json.loads(body) == {
        "error": "model 'faulty' failed in execute: ValueError: negative input"
    }
    client = httpclient.InferenceServerClient(server.url)
    try:
        tensor = httpclient.InferInput("INPUT0", [2], "FP32")
        tensor.set_data_from_numpy(np.array([1.5, 2.5], np.float32))
        result = client.infer("faulty", [tensor])
    finally:
        client.close()
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [2.5, 3.5])
    assert server.proc.poll() is None


def test_config_shows_the_python_backend(server: ServerProcess) -> None:
    config = _json(server, "GET", "/v2/models/scale/config")
    assert isinstance(config, dict)
    assert config["backend"] == "python"
    assert config["platform"] == ""
    assert config["default_model_filename"] == "model.py"
    assert [output["name"] for output in config["output"]] == ["OUTPUT0", "ROWS"]
    metadata = _json(server, "GET", "/v2/models/scale")
    assert isinstance(metadata, dict)
    assert metadata["platform"] == "python"  # metadata names the backend when there is no platform


def test_onnx_models_keep_the_onnxruntime_backend(server: ServerProcess) -> None:
    config = _json(server, "GET", "/v2/models/onnx_identity/config")
    assert isinstance(config, dict)
    assert (config["backend"], config["platform"]) == ("onnxruntime", "onnxruntime_onnx")


def test_loads_that_cannot_work_fail_with_a_reason(
    server: ServerProcess, repository: Path
) -> None:
    index = _json(server, "POST", "/v2/repository/index", b"{}")
    assert isinstance(index, list)
    by_name = {entry["name"]: entry for entry in index}
    assert by_name["scale"]["state"] == "READY"
    gpu = by_name["on_gpu"]
    assert gpu["state"] == "UNAVAILABLE"
    assert "KIND_GPU" in gpu["reason"] and "needs a CUDA device and CuPy" in gpu["reason"]
    missing = by_name["no_config"]
    assert missing["state"] == "UNAVAILABLE"
    assert "must declare its inputs and outputs in config.pbtxt" in missing["reason"]
    assert all(str(repository) not in entry.get("reason", "") for entry in index)
