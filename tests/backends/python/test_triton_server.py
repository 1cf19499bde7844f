"""Triton-style python models (``TritonPythonModel``) served by the real server, over HTTP and
gRPC, in one process and split into front end and executor: an add_sub model written the way
Triton's examples are, per-request objects under dynamic batching, async execute, the errors
Triton answers with, auto_complete_config, BYTES, the model's log lines and metrics,
is_ready, and finalize on unload."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from scripts import make_models
from tests.server_process import ServerProcess, start_server

ADD_SUB_CONFIG = """name: "add_sub"
backend: "python"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 4 ] },
  { name: "REQUESTS" data_type: TYPE_INT32 dims: [ 1 ] }
]
dynamic_batching { max_queue_delay_microseconds: 300000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""
# OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1, REQUESTS = how many request objects
# the execute call that answered this request was given. Counts the requests in a metric
# family, logs each call, and is not ready while a file "not_ready" is in its folder.
ADD_SUB = """import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.folder = args["model_repository"]
        config = json.loads(args["model_config"])
        self.out_dtype = pb_utils.triton_string_to_numpy(
            pb_utils.get_output_config_by_name(config, "OUTPUT0")["data_type"]
        )
        family = pb_utils.MetricFamily(
            name="add_sub_requests_total",
            description="Requests the add_sub model answered",
            kind=pb_utils.MetricFamily.COUNTER,
        )
        self.counter = family.Metric(labels={"model": args["model_name"]})
        pb_utils.Logger.log_info(f"add_sub initialized as {args['model_instance_kind']}")

    def execute(self, requests):
        pb_utils.Logger.log_info(f"add_sub execute with {len(requests)} request(s)")
        responses = []
        for request in requests:
            in0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            rows = in0.shape[0]
            count = np.full((rows, 1), len(requests), np.int32)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("OUTPUT0", (in0 + in1).astype(self.out_dtype)),
                pb_utils.Tensor("OUTPUT1", (in0 - in1).astype(self.out_dtype)),
                pb_utils.Tensor("REQUESTS", count),
            ]))
        self.counter.increment(len(requests))
        return responses

    def is_ready(self):
        return not os.path.exists(os.path.join(self.folder, "not_ready"))

    def finalize(self):
        with open(os.path.join(self.folder, "finalized"), "w") as marker:
            marker.write("yes")
"""
# The request parameter "mode" picks what goes wrong: a TritonError of that code for this
# request, an exception, or a wrong number of responses. Async, to cover async execute.
FAULTS_CONFIG = """name: "faults"
backend: "python"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 2 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 2 ] } ]
"""
FAULTS = """import asyncio
import json

import triton_python_backend_utils as pb_utils

CODES = {
    "invalid": pb_utils.TritonError.INVALID_ARG,
    "not_found": pb_utils.TritonError.NOT_FOUND,
    "unavailable": pb_utils.TritonError.UNAVAILABLE,
    "unsupported": pb_utils.TritonError.UNSUPPORTED,
    "internal": pb_utils.TritonError.INTERNAL,
}


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.sleep(0)
        responses = []
        for request in requests:
            mode = json.loads(request.parameters()).get("mode", "")
            if mode == "raise":
                raise RuntimeError("the model gave up")
            if mode == "short":
                return []
            if mode in CODES:
                error = pb_utils.TritonError(f"refused: {mode}", CODES[mode])
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            x = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            out = pb_utils.Tensor("OUT", x * 10)
            responses.append(pb_utils.InferenceResponse([out], parameters={"mode": mode}))
        return responses
"""
# No tensors in config.pbtxt: auto_complete_config declares them (BYTES in and out).
AUTO_BYTES_CONFIG = """name: "auto_bytes"
backend: "python"
"""
AUTO_BYTES = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]})
        config.add_output({"name": "UPPER", "data_type": "TYPE_STRING", "dims": [-1]})
        config.set_max_batch_size(4)
        config.set_dynamic_batching()
        return config

    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([item.upper() for item in text.reshape(-1)], dtype=object)
            out = pb_utils.Tensor("UPPER", upper.reshape(text.shape))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""
MODELS = {
    "add_sub": (ADD_SUB_CONFIG, ADD_SUB),
    "faults": (FAULTS_CONFIG, FAULTS),
    "auto_bytes": (AUTO_BYTES_CONFIG, AUTO_BYTES),
}


@pytest.fixture(scope="module", params=["0", "1"], ids=["one-process", "split"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServerProcess, Path]]:
    root = tmp_path_factory.mktemp("triton_python_repo")
    for name, (config, code) in MODELS.items():
        make_models.write_text(config, root / name / "config.pbtxt")
        make_models.write_text(code, root / name / "1" / "model.py")
    process = start_server(
        root,
        args=(
            f"--frontends={request.param}",
            "--model-control-mode=explicit",
            "--load-model=*",
        ),
    )
    assert process.port is not None, process.log
    yield process, root
    process.stop()


@pytest.fixture
def server(served: tuple[ServerProcess, Path]) -> ServerProcess:
    return served[0]


def _add_sub_inputs(
    module: type[httpclient.InferInput | grpcclient.InferInput], a: np.ndarray,
    b: np.ndarray,
) -> list[httpclient.InferInput] | list[grpcclient.InferInput]:
    inputs = [module("INPUT0", list(a.shape), "FP32"), module("INPUT1", list(b.shape), "FP32")]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def test_add_sub_over_http_and_grpc(server: ServerProcess) -> None:
    a = np.arange(4, dtype=np.float32).reshape(1, 4)
    b = np.ones((1, 4), np.float32)
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        for client, module in ((http, httpclient.InferInput), (grpc, grpcclient.InferInput)):
            result = client.infer("add_sub", _add_sub_inputs(module, a, b), request_id="r1")
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
            assert result.as_numpy("OUTPUT0").dtype == np.float32
    finally:
        http.close()
        grpc.close()


def test_batched_requests_arrive_as_request_objects_each(server: ServerProcess) -> None:
    count = 6
    client = httpclient.InferenceServerClient(server.url, concurrency=count)
    try:
        sent = []
        for index in range(count):
            rows = 1 + index % 2  # requests of 1 and 2 rows share batches
            a = np.full((rows, 4), index, np.float32)
            b = np.full((rows, 4), 0.5, np.float32)
            pending = client.async_infer("add_sub", _add_sub_inputs(httpclient.InferInput, a, b))
            sent.append((a, b, pending))
        counts = []
        for a, b, pending in sent:
            result = pending.get_result()
            np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
            requests = result.as_numpy("REQUESTS")
            assert requests.shape == (a.shape[0], 1)
            counts.append(int(requests[0, 0]))
    finally:
        client.close()
    assert max(counts) > 1, counts  # several client requests in one execute, one object each


def _faults(server: ServerProcess, mode: str) -> tuple[int, dict[str, object]]:
    body = json.dumps({
        "inputs": [{"name": "IN", "datatype": "INT32", "shape": [2], "data": [1, 2]}],
        "parameters": {"mode": mode},
    }).encode()
    status, _, data = server.request("POST", "/v2/models/faults/infer", body)
    return status, json.loads(data)


@pytest.mark.parametrize(
    ("mode", "status"),
    [("invalid", 400), ("not_found", 404), ("unavailable", 503), ("unsupported", 501),
     ("internal", 500)],
)
def test_a_triton_error_fails_its_request_with_its_status(
    server: ServerProcess, mode: str, status: int
) -> None:
    assert _faults(server, mode) == (status, {"error": f"refused: {mode}"})


def test_triton_error_codes_over_grpc(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = grpcclient.InferInput("IN", [2], "INT32")
    tensor.set_data_from_numpy(np.array([1, 2], np.int32))
    try:
        for mode, code in (("invalid", "StatusCode.INVALID_ARGUMENT"),
                           ("not_found", "StatusCode.NOT_FOUND"),
                           ("unavailable", "StatusCode.UNAVAILABLE"),
                           ("unsupported", "StatusCode.UNIMPLEMENTED")):
            with pytest.raises(InferenceServerException) as caught:
                client.infer("faults", [tensor], parameters={"mode": mode})
            assert caught.value.status() == code
            assert caught.value.message() == f"refused: {mode}"
        result = client.infer("faults", [tensor], parameters={"mode": "fine"})
        np.testing.assert_array_equal(result.as_numpy("OUT"), [10, 20])
    finally:
        client.close()


def test_an_exception_or_a_short_return_fails_the_call(server: ServerProcess) -> None:
    status, body = _faults(server, "raise")
    assert status == 500
    assert body["error"] == (
        "Failed to process the request(s) for model 'faults', message: RuntimeError: the "
        "model gave up"
    )
    status, body = _faults(server, "short")
    assert status == 500
    assert str(body["error"]).startswith(
        "Failed to process the request(s) for model 'faults', message: Number of "
        "InferenceResponse objects do not match"
    )
    assert _faults(server, "fine")[0] == 200  # the model goes on serving


def test_auto_complete_config_and_bytes(server: ServerProcess) -> None:
    status, _, data = server.request("GET", "/v2/models/auto_bytes/config")
    assert status == 200, data
    config = json.loads(data)
    assert config["max_batch_size"] == 4 and "dynamic_batching" in config
    assert [(t["name"], t["data_type"]) for t in config["input"]] == [("TEXT", "TYPE_STRING")]
    assert [(t["name"], t["data_type"]) for t in config["output"]] == [("UPPER", "TYPE_STRING")]
    client = grpcclient.InferenceServerClient(server.grpc_url)
    text = np.array([[b"abc", b"x\x00y", b""]], dtype=object)
    tensor = grpcclient.InferInput("TEXT", [1, 3], "BYTES")
    tensor.set_data_from_numpy(text)
    try:
        result = client.infer("auto_bytes", [tensor])
    finally:
        client.close()
    assert result.as_numpy("UPPER").tolist() == [[b"ABC", b"X\x00Y", b""]]


def test_log_lines_and_metrics(server: ServerProcess) -> None:
    a = np.zeros((1, 4), np.float32)
    client = httpclient.InferenceServerClient(server.url)
    try:
        client.infer("add_sub", _add_sub_inputs(httpclient.InferInput, a, a))
    finally:
        client.close()
    server.wait_for_log("add_sub initialized as CPU")
    server.wait_for_log("add_sub execute with 1 request(s)")
    page = server.metrics()
    assert "# TYPE add_sub_requests_total counter" in page
    line = next(x for x in page.splitlines() if x.startswith("add_sub_requests_total{"))
    assert line.startswith('add_sub_requests_total{model="add_sub"} ')
    assert float(line.split()[-1]) >= 1


def test_is_ready_is_asked_on_model_ready(served: tuple[ServerProcess, Path]) -> None:
    server, root = served
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    flag = root / "add_sub" / "not_ready"
    try:
        assert server.request("GET", "/v2/models/add_sub/ready")[0] == 200
        flag.write_text("")
        assert server.request("GET", "/v2/models/add_sub/ready")[0] == 400
        assert not grpc.is_model_ready("add_sub")
        flag.unlink()
        assert grpc.is_model_ready("add_sub")
    finally:
        flag.unlink(missing_ok=True)
        grpc.close()


def test_finalize_is_called_on_unload(served: tuple[ServerProcess, Path]) -> None:
    server, root = served
    marker = root / "add_sub" / "finalized"
    status, _, body = server.request("POST", "/v2/repository/models/add_sub/unload", b"{}")
    assert status == 200, body
    deadline = time.monotonic() + 10
    while not marker.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert marker.read_text() == "yes"
    status, _, body = server.request("POST", "/v2/repository/models/add_sub/load", b"{}")
    assert status == 200, body
