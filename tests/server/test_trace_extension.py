"""The trace extension against a real server, in both process layouts (one process, and two
front ends with the executor): the trace settings over HTTP and gRPC (global and per model,
through NVIDIA's ``tritonclient``) with Triton's semantics and texts; Triton-mode trace files
of Triton's shape for HTTP and gRPC requests; sampling by rate and count; OpenTelemetry spans
reaching an OTLP receiver, continuing the caller's ``traceparent``."""

from __future__ import annotations

import json
import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from scripts import make_models
from tests.otlp_receiver import OtlpReceiver
from tests.server_process import ServerProcess, start_server

LAYOUTS = {"one process": "--frontends=0", "split": "--frontends=2"}
KEYS = ("trace_level", "trace_rate", "trace_count", "log_frequency")
#: A client's span: the traces it starts on the server continue this trace id.
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
HTTP_ORDER = [
    "HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
    "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "INFER_RESPONSE_COMPLETE",
    "REQUEST_END", "HTTP_SEND_START", "HTTP_SEND_END",
]


#: Two ``echo`` steps, one after the other.
ENSEMBLE = """name: "twice"
platform: "ensemble"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] } ]
ensemble_scheduling { step [
  { model_name: "echo" model_version: -1
    input_map { key: "INPUT0" value: "INPUT0" } output_map { key: "OUTPUT0" value: "middle" } },
  { model_name: "echo" model_version: -1
    input_map { key: "INPUT0" value: "middle" } output_map { key: "OUTPUT0" value: "OUTPUT0" } }
] }
"""


def _repository(root: Path) -> Path:
    make_models.save(make_models.identity("FP32", ["batch", 4]), root / "echo" / "1" / "model.onnx")
    make_models.write_text(
        make_models.config_pbtxt("echo", 8, [("INPUT0", "FP32", [4])], [("OUTPUT0", "FP32", [4])]),
        root / "echo" / "config.pbtxt",
    )
    (root / "twice" / "1").mkdir(parents=True)
    make_models.write_text(ENSEMBLE, root / "twice" / "config.pbtxt")
    return root


@pytest.fixture(scope="module", params=list(LAYOUTS))
def traced(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    tuple[ServerProcess, Path]
]:
    """A server tracing every request at TIMESTAMPS into ``trace.json.<n>``, one per trace."""
    root = _repository(tmp_path_factory.mktemp("trace_repo"))
    out = tmp_path_factory.mktemp("traces") / "trace.json"
    process = start_server(
        root,
        args=(LAYOUTS[request.param], f"--trace-config=triton,file={out}",
              "--trace-config=level=TIMESTAMPS", "--trace-config=rate=1",
              "--trace-log-frequency=1"),
    )
    assert process.port is not None, process.log
    yield process, out
    process.stop()


@pytest.fixture
def server(traced: tuple[ServerProcess, Path]) -> Iterator[ServerProcess]:
    """The server with its trace settings put back to the flags' after the test."""
    yield traced[0]
    with httpclient.InferenceServerClient(traced[0].url) as client:
        client.update_trace_settings(model_name="echo", settings=dict.fromkeys(KEYS))
        client.update_trace_settings(settings=dict.fromkeys(KEYS))


def _expected(path: Path, level: list[str], rate: str = "1", count: str = "-1",
              frequency: str = "1") -> dict[str, Any]:
    return {"trace_level": level, "trace_rate": rate, "trace_count": count,
            "log_frequency": frequency, "trace_file": str(path), "trace_mode": "triton"}


def _grpc_settings(client: grpcclient.InferenceServerClient, **kwargs: Any) -> dict[str, Any]:
    answer = (client.update_trace_settings(**kwargs, as_json=True) if "settings" in kwargs
              else client.get_trace_settings(**kwargs, as_json=True))
    return {key: value.get("value", []) for key, value in answer["settings"].items()}


def test_metadata_lists_the_extension(server: ServerProcess, connect: Callable[..., Any]) -> None:
    client = connect(httpclient, server.url)
    assert "trace" in client.get_server_metadata()["extensions"]


def test_http_settings_models_follow_the_global_ones(
    server: ServerProcess, traced: tuple[ServerProcess, Path],
    connect: Callable[..., Any],
) -> None:
    path = traced[1]
    client = connect(httpclient, server.url)
    assert client.get_trace_settings() == _expected(path, ["TIMESTAMPS"])
    assert client.get_trace_settings(model_name="echo") == _expected(path, ["TIMESTAMPS"])
    # Triton's L0_trace sequence: a model's own values stay, the rest follows the global.
    assert client.update_trace_settings(
        model_name="echo", settings={"trace_rate": "12", "log_frequency": "34"}
    ) == _expected(path, ["TIMESTAMPS"], "12", frequency="34")
    assert client.update_trace_settings(
        settings={"trace_rate": "56", "trace_count": "78", "trace_level": ["OFF"]}
    ) == _expected(path, ["OFF"], "56", "78")
    assert client.get_trace_settings(model_name="echo") == _expected(
        path, ["OFF"], "12", "78", "34"
    )
    # Cleared: the global one goes back to the flags', the model's to the global one.
    assert client.update_trace_settings(
        settings={"trace_rate": None, "trace_count": None}
    ) == _expected(path, ["OFF"])
    assert client.update_trace_settings(
        model_name="echo", settings={"trace_rate": None, "trace_level": None}
    ) == _expected(path, ["OFF"], frequency="34")


def test_grpc_settings_models_follow_the_global_ones(
    server: ServerProcess, traced: tuple[ServerProcess, Path],
    connect: Callable[..., Any],
) -> None:
    path = str(traced[1])
    client = connect(grpcclient, server.grpc_url)
    initial = {"trace_level": ["TIMESTAMPS"], "trace_rate": ["1"], "trace_count": ["-1"],
               "log_frequency": ["1"], "trace_file": [path], "trace_mode": ["triton"]}
    assert _grpc_settings(client) == initial
    assert _grpc_settings(client, model_name="echo") == initial
    changed = _grpc_settings(
        client, model_name="echo", settings={"trace_level": ["TIMESTAMPS", "TENSORS"]}
    )
    assert changed == {**initial, "trace_level": ["TIMESTAMPS", "TENSORS"]}
    assert _grpc_settings(client, settings={"trace_rate": "9"}) == {**initial, "trace_rate": ["9"]}
    assert _grpc_settings(client, model_name="echo") == {
        **initial, "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": ["9"],
    }
    # tritonclient sends a None value as an empty list: cleared.
    assert _grpc_settings(client, model_name="echo", settings={"trace_level": None}) == {
        **initial, "trace_rate": ["9"],
    }


def test_refusals_with_tritons_texts(server: ServerProcess, connect: Callable[..., Any]) -> None:
    http = connect(httpclient, server.url)
    grpc = connect(grpcclient, server.grpc_url)
    cases: list[tuple[Any, str]] = [
        (lambda: http.get_trace_settings(model_name="nope"), "Request for unknown model : nope"),
        (lambda: grpc.get_trace_settings(model_name="nope"), "Request for unknown model : nope"),
        (lambda: http.update_trace_settings(model_name="nope", settings={"trace_file": "x"}),
         "Request for unknown model : nope"),
        (lambda: grpc.update_trace_settings(model_name="nope", settings={"trace_rate": "x"}),
         "Request for unknown model : nope"),
        (lambda: http.update_trace_settings(settings={"trace_file": "x"}),
         "trace file location can not be updated through network protocol"),
        (lambda: grpc.update_trace_settings(settings={"trace_file": "x"}),
         "trace file location can not be updated through network protocol"),
        (lambda: http.update_trace_settings(settings={"trace_level": ["OFF", "TENSORS"]}),
         "Expect only one trace level 'OFF' is specified"),
        (lambda: http.update_trace_settings(settings={"trace_rate": "fast"}),
         "Unable to parse 'trace_rate', got: fast"),
        (lambda: grpc.update_trace_settings(settings={"trace_count": "-3"}),
         "Unable to parse 'trace_count'. Expecting value >= -1, got: -3"),
        (lambda: http.update_trace_settings(settings={"trace_rate": "0"}),
         "Attempting to set invalid trace setting :sample rate must be non-zero"),
    ]
    for call, message in cases:
        with pytest.raises(InferenceServerException) as exc:
            call()
        assert message in exc.value.message(), message
    status, _, body = server.request("POST", "/v2/trace/setting", b"{\"trace_file\": null}")
    assert (status, json.loads(body)) == (501, {
        "error": "trace file location can not be updated through network protocol",
    })
    assert http.get_trace_settings()["trace_rate"] == "1"  # nothing changed


def _http_infer(server: ServerProcess, request_id: str, headers: dict[str, str] | None = None,
                model: str = "echo") -> None:
    tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    with httpclient.InferenceServerClient(server.url) as client:
        client.infer(model, [tensor], request_id=request_id, headers=headers)


def _grpc_infer(server: ServerProcess, request_id: str, headers: dict[str, str] | None = None
                ) -> None:
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.arange(4, dtype=np.float32).reshape(1, 4))
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.infer("echo", [tensor], request_id=request_id, headers=headers)


def _traces_of(path: Path, request_id: str, expected: int = 1, timeout: float = 10.0
               ) -> list[list[dict[str, Any]]]:
    """The traces (each its JSON objects) of client requests with ``request_id`` in the
    indexed files (not their ensemble steps'), once there are ``expected`` of them."""
    deadline = time.monotonic() + timeout
    found: list[list[dict[str, Any]]] = []
    while time.monotonic() < deadline:
        found = []
        for file in path.parent.glob(path.name + ".*"):
            objects = json.loads(file.read_text())
            ids = {o["id"] for o in objects
                   if o.get("request_id") == request_id and "parent_id" not in o}
            found += [[o for o in objects if o["id"] == i] for i in sorted(ids)]
        if len(found) >= expected:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{len(found)} traces of {request_id!r}, expected {expected}")


def _names(trace: list[dict[str, Any]]) -> list[str]:
    return [o["timestamps"][0]["name"] for o in trace if "timestamps" in o]


def _check_clock(trace: list[dict[str, Any]]) -> None:
    stamps = [o["timestamps"][0]["ns"] for o in trace if "timestamps" in o]
    assert stamps == sorted(stamps) and stamps[0] > 0


def test_file_mode_writes_tritons_json_for_http_and_grpc(
    server: ServerProcess, traced: tuple[ServerProcess, Path]
) -> None:
    _http_infer(server, "file-http")
    (trace,) = _traces_of(traced[1], "file-http")
    record = trace[2]
    assert record == {"id": record["id"], "model_name": "echo", "model_version": 1,
                      "request_id": "file-http"}
    assert all(set(o) == {"id", "timestamps"} for o in trace if o is not record)
    assert _names(trace) == HTTP_ORDER
    _check_clock(trace)
    _grpc_infer(server, "file-grpc")
    (trace,) = _traces_of(traced[1], "file-grpc")
    assert _names(trace) == [
        "GRPC_WAITREAD_START", "GRPC_WAITREAD_END", *HTTP_ORDER[2:-2], "GRPC_SEND_START",
        "GRPC_SEND_END",
    ]
    _check_clock(trace)


def test_grpc_stream_requests_are_traced(
    server: ServerProcess, traced: tuple[ServerProcess, Path],
    connect: Callable[..., Any],
) -> None:
    client = connect(grpcclient, server.grpc_url)
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put(error or result))
    tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
    tensor.set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
    try:
        client.async_stream_infer("echo", [tensor], request_id="streamed")
        assert not isinstance(results.get(timeout=30), InferenceServerException)
    finally:
        client.stop_stream()
    (trace,) = _traces_of(traced[1], "streamed")
    assert _names(trace)[-2:] == ["GRPC_SEND_START", "GRPC_SEND_END"]
    _check_clock(trace)


def test_ensemble_steps_are_child_traces(
    server: ServerProcess, traced: tuple[ServerProcess, Path]
) -> None:
    _http_infer(server, "ensemble", model="twice")
    (trace,) = _traces_of(traced[1], "ensemble")
    parent = trace[2]["id"]
    assert trace[2] == {"id": parent, "model_name": "twice", "model_version": 1,
                        "request_id": "ensemble"}
    assert _names(trace) == [*HTTP_ORDER[:4], *HTTP_ORDER[8:]]  # no compute of its own
    files = traced[1].parent.glob(traced[1].name + ".*")
    objects = [o for f in files for o in json.loads(f.read_text())]
    children = [o for o in objects if o.get("parent_id") == parent]
    assert [c["model_name"] for c in children] == ["echo", "echo"]
    for child in children:
        steps = [o for o in objects if o["id"] == child["id"]]
        assert _names(steps) == HTTP_ORDER[2:-2] and child["request_id"] == "ensemble"


def test_tensors_level(
    server: ServerProcess, traced: tuple[ServerProcess, Path], connect: Callable[..., Any]
) -> None:
    client = connect(httpclient, server.url)
    client.update_trace_settings(model_name="echo", settings={"trace_level": ["TENSORS"]})
    _http_infer(server, "tensors")
    (trace,) = _traces_of(traced[1], "tensors")
    assert [o for o in trace if "activity" in o] == [
        {"id": trace[0]["id"], "activity": activity,
         "tensor": {"name": name, "data": "0,1,2,3", "shape": "1,4", "dtype": "FP32"}}
        for activity, name in (("TENSOR_QUEUE_INPUT", "INPUT0"),
                               ("TENSOR_BACKEND_OUTPUT", "OUTPUT0"))
    ]
    assert _names(trace) == []  # TENSORS alone: no timestamps


def test_rate_and_count_sample_requests(
    server: ServerProcess, traced: tuple[ServerProcess, Path],
    connect: Callable[..., Any],
) -> None:
    client = connect(httpclient, server.url)
    client.update_trace_settings(model_name="echo", settings={"trace_rate": "2",
                                                              "trace_count": "2"})
    for _ in range(7):
        _http_infer(server, "sampled")
    traces = _traces_of(traced[1], "sampled", expected=2)
    time.sleep(0.3)
    assert len(_traces_of(traced[1], "sampled", expected=2)) == len(traces) == 2
    assert client.get_trace_settings(model_name="echo")["trace_count"] == "0"
    client.update_trace_settings(settings={"trace_level": ["OFF"]})
    assert client.get_trace_settings(model_name="echo")["trace_level"] == ["OFF"]


@pytest.fixture(scope="module", params=list(LAYOUTS))
def otel(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
    tuple[ServerProcess, OtlpReceiver]
]:
    """A server in OpenTelemetry mode tracing only requests with a ``traceparent``
    (``rate=0``), exporting to a local receiver every 100 ms."""
    root = _repository(tmp_path_factory.mktemp("otel_repo"))
    receiver = OtlpReceiver()
    process = start_server(
        root,
        args=(LAYOUTS[request.param], "--trace-config=mode=opentelemetry",
              "--trace-config=level=TIMESTAMPS", "--trace-config=rate=0",
              f"--trace-config=opentelemetry,url={receiver.url}",
              "--trace-config=opentelemetry,bsp_schedule_delay=100",
              "--trace-config=opentelemetry,resource=deployment=test"),
    )
    assert process.port is not None, process.log
    yield process, receiver
    process.stop()
    receiver.close()


def test_opentelemetry_settings_answer(
    otel: tuple[ServerProcess, OtlpReceiver], connect: Callable[..., Any]
) -> None:
    process, receiver = otel
    assert connect(httpclient, process.url).get_trace_settings() == {
        "trace_level": ["TIMESTAMPS"], "trace_rate": "0", "trace_count": "-1",
        "trace_mode": "opentelemetry", "url": receiver.url, "bsp_schedule_delay": "100",
        "resource": "deployment=test", "bsp_max_queue_size": "2048",
        "bsp_max_export_batch_size": "512",
    }


def test_an_ensemble_has_spans_for_each_step(otel: tuple[ServerProcess, OtlpReceiver]) -> None:
    process, receiver = otel
    before = len(receiver.spans)
    _http_infer(process, "ensemble", {"traceparent": TRACEPARENT}, model="twice")
    spans = receiver.wait_for(before + 6)[before:]
    names = sorted(span.name for span in spans)
    assert names == ["InferRequest", "compute", "compute", "echo", "echo", "twice"]
    ids = {span.name: span.span_id for span in spans if span.name in ("InferRequest", "twice")}
    steps = [span for span in spans if span.name == "echo"]
    assert {span.parent_span_id for span in steps} == {ids["twice"]}
    assert next(s for s in spans if s.name == "twice").parent_span_id == ids["InferRequest"]


@pytest.mark.parametrize("transport", ["HTTP", "GRPC"])
def test_spans_continue_the_callers_trace(
    otel: tuple[ServerProcess, OtlpReceiver], transport: str
) -> None:
    process, receiver = otel
    before = len(receiver.spans)
    infer = _http_infer if transport == "HTTP" else _grpc_infer
    infer(process, f"untraced-{transport}")  # no traceparent, rate 0: not traced
    infer(process, f"traced-{transport}", {"traceparent": TRACEPARENT})
    spans = receiver.wait_for(before + 3)[before:]
    time.sleep(0.3)
    assert len(receiver.spans) == before + 3
    by_name = {span.name: span for span in spans}
    assert set(by_name) == {"InferRequest", "echo", "compute"}
    assert {span.trace_id.hex() for span in spans} == {"0af7651916cd43dd8448eb211c80319c"}
    root, model, compute = by_name["InferRequest"], by_name["echo"], by_name["compute"]
    assert root.parent_span_id.hex() == "b7ad6b7169203331"
    assert model.parent_span_id == root.span_id and compute.parent_span_id == model.span_id
    received = "RECV" if transport == "HTTP" else "WAITREAD"
    assert [e.name for e in root.events] == [
        f"{transport}_{received}_START", f"{transport}_{received}_END",
        f"{transport}_SEND_START", f"{transport}_SEND_END",
    ]
    assert [e.name for e in model.events] == [
        "REQUEST_START", "QUEUE_START", "INFER_RESPONSE_COMPLETE", "REQUEST_END",
    ]
    assert [e.name for e in compute.events] == [
        "COMPUTE_START", "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END",
    ]
    attributes = {a.key: a.value for a in model.attributes}
    assert attributes["triton.model_name"].string_value == "echo"
    assert attributes["triton.model_version"].int_value == 1
    assert attributes["triton.request_id"].string_value == f"traced-{transport}"
    assert root.start_time_unix_nano <= model.start_time_unix_nano <= compute.start_time_unix_nano
    assert compute.end_time_unix_nano <= model.end_time_unix_nano <= root.end_time_unix_nano
    assert abs(root.start_time_unix_nano - time.time_ns()) < 60 * 10**9  # wall clock
    assert {"service.name": "triton-inference-server", "deployment": "test"}.items() <= (
        receiver.resources[-1].items()
    )
