"""BLS and decoupled python models served by the real server, in one process and split into
front end and executor: a model calling another (sync and async), its errors (Triton's texts),
model control from a model, a self-call that must not hang; decoupled models streamed over
gRPC ``ModelStreamInfer`` as tritonclient's stream examples use them (final flags, empty
finals only when asked, errors on the stream), and refused by HTTP and unary ``ModelInfer``."""

from __future__ import annotations

import json
import queue
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.backends.python.bls_models import write_repository
from tests.server_process import ServerProcess, start_server

_WAIT_S = 20.0


@pytest.fixture(scope="module", params=["0", "1"], ids=["one-process", "split"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    root = write_repository(tmp_path_factory.mktemp("bls_repo"))
    process = start_server(
        root,
        args=(f"--frontends={request.param}", "--model-control-mode=explicit", "--load-model=*"),
    )
    assert process.port is not None, process.log
    yield process
    process.stop()


def _input(name: str, values: list[int], datatype: str = "INT32") -> grpcclient.InferInput:
    array = np.array(values, np.int32 if datatype == "INT32" else np.uint32)
    tensor = grpcclient.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _successes(server: ServerProcess, model: str) -> int:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)
    finally:
        client.close()
    return int(stats["model_stats"][0]["inference_stats"]["success"].get("count", 0))


def _failures(server: ServerProcess, model: str) -> int:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        stats = client.get_inference_statistics(model, as_json=True)
    finally:
        client.close()
    return int(stats["model_stats"][0]["inference_stats"]["fail"].get("count", 0))


def _bls(server: ServerProcess, model: str, values: list[int], **params: Any) -> np.ndarray:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        result = client.infer(model, [_input("IN", values)], parameters=params or None)
    finally:
        client.close()
    out: np.ndarray | None = result.as_numpy("OUT")
    assert out is not None
    return out


# --- BLS ------------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["bls", "bls_async"])
def test_a_model_calls_another(server: ServerProcess, model: str) -> None:
    before = _successes(server, "double")
    assert _bls(server, model, [1, 2, 3]).tolist() == [2, 4, 6]
    # through the target's scheduler and statistics, as a client's request
    assert _successes(server, "double") - before == 1


@pytest.mark.parametrize("model", ["bls", "bls_async"])
def test_bls_errors_are_the_targets_with_tritons_texts(server: ServerProcess, model: str) -> None:
    with pytest.raises(InferenceServerException) as missing:
        _bls(server, model, [1], target="missing")
    assert "Failed for execute the inference request. Model 'missing' is not ready." in str(
        missing.value
    )
    with pytest.raises(InferenceServerException) as decoupled:
        _bls(server, model, [1], target="square_int32")
    assert "Please use 'decoupled=True' argument to the 'exec' or 'async_exec' calls" in str(
        decoupled.value
    )
    assert _bls(server, model, [5]).tolist() == [10]  # and it serves on


@pytest.mark.parametrize("model", ["bls", "bls_async"])
def test_a_target_named_by_bytes_is_found(server: ServerProcess, model: str) -> None:
    # NVIDIA's BLS example passes an element of a BYTES input (bytes) as the model name
    assert _bls(server, model, [4], mode="bytes_name").tolist() == [8]


def test_an_output_of_another_datatype_goes_out_as_the_model_made_it(
    server: ServerProcess,
) -> None:
    # the config says INT32; Triton sends a python model's INT64 tensor as INT64
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    http = httpclient.InferenceServerClient(server.url)
    try:
        by_grpc = grpc.infer("bls", [_input("IN", [1, 2])], parameters={"mode": "wide"})
        tensor = httpclient.InferInput("IN", [2], "INT32")
        tensor.set_data_from_numpy(np.array([3, 4], np.int32), binary_data=False)
        by_http = http.infer("bls", [tensor], parameters={"mode": "wide"})
    finally:
        grpc.close()
        http.close()
    assert by_grpc.get_output("OUT").datatype == "INT64"
    assert by_grpc.as_numpy("OUT").tolist() == [2, 4]
    assert by_http.get_output("OUT")["datatype"] == "INT64"
    assert by_http.as_numpy("OUT").tolist() == [6, 8]


_BLS_IN_INITIALIZE = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        pb_utils.InferenceRequest(
            model_name="double", requested_output_names=["OUT"],
            inputs=[pb_utils.Tensor("IN", np.zeros(1, np.int32))],
        ).exec()

    def execute(self, requests):
        return []
"""


def test_bls_in_initialize_fails_the_load(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    config = {
        "backend": "python",
        "input": [{"name": "IN", "data_type": "TYPE_INT32", "dims": [1]}],
        "output": [{"name": "OUT", "data_type": "TYPE_INT32", "dims": [1]}],
    }
    with pytest.raises(InferenceServerException) as failed:
        client.load_model(
            "bls_in_initialize", config=json.dumps(config),
            files={"file:1/model.py": _BLS_IN_INITIALIZE.encode()},
        )
    assert "BLS is only supported during the 'execute' function." in str(failed.value)
    assert _bls(server, "bls", [5]).tolist() == [10]  # and the others serve on


def _grpc_parameters(result: Any) -> dict[str, Any]:
    params = result.get_response().parameters
    return {key: getattr(value, value.WhichOneof("parameter_choice")) for key, value in params.items()}


def test_response_parameters_are_sent_back(server: ServerProcess) -> None:
    expected = {"bool": True, "int": 7, "str": "seven"}
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    http = httpclient.InferenceServerClient(server.url)
    try:
        by_grpc = grpc.infer("bls", [_input("IN", [1])], parameters={"mode": "params"})
        tensor = httpclient.InferInput("IN", [1], "INT32")
        tensor.set_data_from_numpy(np.array([1], np.int32))
        by_http = http.infer("bls", [tensor], parameters={"mode": "params"})
        # a BLS caller reads its target's (bls_async answers mode "params"), and sends them on
        forwarded = grpc.infer(
            "bls", [_input("IN", [1])], parameters={"mode": "forward", "target": "bls_async"}
        )
        plain = grpc.infer("bls", [_input("IN", [1])])
    finally:
        grpc.close()
        http.close()
    assert _grpc_parameters(by_grpc) == expected
    assert by_http.get_response()["parameters"] == expected
    assert _grpc_parameters(forwarded) == expected
    assert _grpc_parameters(plain) == {}


@pytest.mark.parametrize("model", ["bls", "bls_async"])
def test_a_single_instance_calling_itself_is_refused_at_once(
    server: ServerProcess, model: str
) -> None:
    with pytest.raises(InferenceServerException) as refused:
        _bls(server, model, [1], target=model)
    assert "which would wait for itself forever" in str(refused.value)
    assert _bls(server, model, [5]).tolist() == [10]  # and it serves on


def test_a_busy_single_instance_calling_another_serves_every_request(
    server: ServerProcess,
) -> None:
    results: queue.Queue[list[int] | InferenceServerException] = queue.Queue()

    def call(value: int) -> None:
        try:
            results.put(_bls(server, "bls", [value]).tolist())
        except InferenceServerException as exc:  # reported below
            results.put(exc)

    threads = [threading.Thread(target=call, args=(value,)) for value in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(_WAIT_S)
    answers = [results.get_nowait() for _ in threads]
    assert sorted(a[0] for a in answers if isinstance(a, list)) == [0, 2, 4, 6, 8, 10], answers


@pytest.mark.parametrize("model", ["bls", "bls_async"])
def test_bls_decoupled_exec_yields_each_response(server: ServerProcess, model: str) -> None:
    # as Triton's iterator: a flags-only final is the last, empty, response
    assert _bls(server, model, [3], mode="stream").tolist() == [3, 3, 3, -1]
    assert _bls(server, model, [0], mode="stream").tolist() == [-1]
    with pytest.raises(InferenceServerException, match="cannot send -1 responses"):
        _bls(server, model, [-1], mode="stream")
    assert _bls(server, model, [5]).tolist() == [10]  # and it serves on


@pytest.mark.parametrize("model", ["bls", "bls_async"])
def test_bls_decoupled_exec_returns_at_the_first_response(
    server: ServerProcess, model: str
) -> None:
    # Triton's exec / async_exec(decoupled=True) give the iterator once the first response
    # is in, not after the last; each next() waits for one (two, then the final flag alone)
    count, returned_ms, done_ms = _bls(server, model, [0], mode="first").tolist()
    assert count == 3
    assert returned_ms < done_ms - 500, (returned_ms, done_ms)


def test_a_bls_decoupled_call_can_be_cancelled(server: ServerProcess) -> None:
    seen, took_ms = _bls(server, "bls", [0], mode="cancel").tolist()
    # the first response, then the cancellation's error; not the one a second later
    assert seen == 2 and took_ms < 900, (seen, took_ms)
    assert _bls(server, "bls", [5]).tolist() == [10]  # and it serves on


def test_model_control_from_a_model(server: ServerProcess) -> None:
    assert _bls(server, "bls", [0], mode="control", target="spare").tolist() == [1, 0, 1]
    assert _bls(server, "bls", [4], target="spare").tolist() == [8]


# --- decoupled ------------------------------------------------------------------------------


class _Stream:
    """A tritonclient gRPC stream whose callback collects results and errors."""

    def __init__(self, server: ServerProcess) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.items: queue.Queue[tuple[Any, Any]] = queue.Queue()
        self.client.start_stream(callback=lambda result, error: self.items.put((result, error)))

    def take(self, count: int) -> list[tuple[Any, Any]]:
        return [self.items.get(timeout=_WAIT_S) for _ in range(count)]

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()


@pytest.fixture
def stream(server: ServerProcess) -> Iterator[_Stream]:
    opened = _Stream(server)
    yield opened
    opened.close()


def _final(result: Any) -> bool:
    return bool(result.get_response().parameters["triton_final_response"].bool_param)


def _repeat_inputs(values: list[int], delays: list[int], wait: int) -> list[Any]:
    return [
        _input("IN", values), _input("DELAY", delays, "UINT32"), _input("WAIT", [wait], "UINT32")
    ]


def test_repeat_sends_each_element_then_an_empty_final_when_asked(stream: _Stream) -> None:
    stream.client.async_stream_infer(
        "repeat_int32", _repeat_inputs([4, 2, 0, 1], [1, 2, 3, 4], 5), request_id="r1",
        enable_empty_final_response=True,
    )
    items = stream.take(5)
    assert all(error is None for _, error in items), items
    results = [result for result, _ in items]
    assert [r.as_numpy("OUT").tolist() for r in results[:4]] == [[4], [2], [0], [1]]
    assert [r.as_numpy("IDX").tolist() for r in results[:4]] == [[0], [1], [2], [3]]
    assert [_final(r) for r in results] == [False, False, False, False, True]
    assert all(r.get_response().id == "r1" for r in results)
    last = results[4].get_response()
    assert last.model_name == "repeat_int32" and last.model_version == "1"
    assert not last.outputs  # empty: the flag alone


def test_without_asking_no_empty_final_is_sent(stream: _Stream) -> None:
    stream.client.async_stream_infer("square_int32", [_input("IN", [2])], request_id="s2")
    stream.client.async_stream_infer("square_int32", [_input("IN", [1])], request_id="s1")
    items = stream.take(3)
    assert all(error is None for _, error in items), items
    by_id: dict[str, list[bool]] = {}
    left: dict[str, list[int]] = {}
    for result, _ in items:
        by_id.setdefault(result.get_response().id, []).append(_final(result))
        # each response's own parameters, beside the stream's triton_final_response
        left.setdefault(result.get_response().id, []).append(
            _grpc_parameters(result)["left"]
        )
        assert result.as_numpy("OUT").tolist() in ([2], [1])
    assert by_id == {"s2": [False, False], "s1": [False]}
    assert left == {"s2": [1, 0], "s1": [0]}
    with pytest.raises(queue.Empty):
        stream.items.get(timeout=0.5)


def test_zero_responses_and_an_error_on_the_stream(stream: _Stream) -> None:
    stream.client.async_stream_infer(
        "square_int32", [_input("IN", [0])], request_id="zero", enable_empty_final_response=True
    )
    ((result, error),) = stream.take(1)
    assert error is None and _final(result) and result.get_response().id == "zero"
    stream.client.async_stream_infer("square_int32", [_input("IN", [-1])], request_id="neg")
    ((result, error),) = stream.take(1)
    assert result is None and "cannot send -1 responses" in str(error)
    stream.client.async_stream_infer("square_int32", [_input("IN", [-2])], request_id="raise")
    ((result, error),) = stream.take(1)
    assert result is None
    assert "Failed to process the request(s) for model 'square_int32'" in str(error)
    assert "square gave up" in str(error)
    # the stream goes on, and a non-decoupled model on it answers once, flagged final
    stream.client.async_stream_infer("double", [_input("IN", [3])], request_id="d")
    ((result, error),) = stream.take(1)
    assert error is None and _final(result) and result.as_numpy("OUT").tolist() == [6]


def test_decoupled_models_are_refused_by_http_and_unary_grpc(server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(server.url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([1], np.int32))
    try:
        with pytest.raises(InferenceServerException) as by_http:
            http.infer("square_int32", [tensor])
        assert "HTTP end point doesn't support models with decoupled transaction policy" in str(
            by_http.value
        )
        with pytest.raises(InferenceServerException) as by_grpc:
            grpc.infer("square_int32", [_input("IN", [1])])
        assert by_grpc.value.status() == "StatusCode.UNIMPLEMENTED"
        assert "ModelInfer RPC doesn't support models with decoupled transaction policy" in str(
            by_grpc.value
        )
        # both still serve a non-decoupled model
        served = http.infer("double", [tensor]).as_numpy("OUT")
        assert served is not None and served.tolist() == [2]
        assert grpc.infer("double", [_input("IN", [1])]).as_numpy("OUT").tolist() == [2]
    finally:
        http.close()
        grpc.close()


@pytest.mark.parametrize("n", [2, 7])
def test_decoupled_statistics_count_the_request(
    server: ServerProcess, stream: _Stream, n: int
) -> None:
    """Counted once the final response is out, also when the model works on after it (7)."""
    before = _successes(server, "square_int32")
    stream.client.async_stream_infer(
        "square_int32", [_input("IN", [n])], enable_empty_final_response=True
    )
    items = stream.take(n + 1)
    assert all(error is None for _, error in items), items
    results = [result for result, _ in items]
    assert [r.as_numpy("OUT").tolist() for r in results[:n]] == [[n]] * n
    assert [_final(r) for r in results] == [False] * n + [True]
    assert _successes(server, "square_int32") - before == 1


def test_a_stream_given_up_midway_leaves_the_server_serving(server: ServerProcess) -> None:
    first = _Stream(server)
    try:
        first.client.async_stream_infer(
            "repeat_int32", _repeat_inputs([1, 2, 3], [1, 300, 300], 0), request_id="gone"
        )
        ((result, error),) = first.take(1)
        assert error is None and result.as_numpy("OUT").tolist() == [1]
    finally:
        first.close()  # the client goes away while the model still sends
    second = _Stream(server)
    try:
        second.client.async_stream_infer(
            "repeat_int32", _repeat_inputs([7], [1], 0), request_id="next",
            enable_empty_final_response=True,
        )
        items = second.take(2)
        assert [error for _, error in items] == [None, None]
        assert items[0][0].as_numpy("OUT").tolist() == [7] and _final(items[1][0])
    finally:
        second.close()


def test_a_stream_that_ends_with_an_error_counts_as_a_failure(
    server: ServerProcess, stream: _Stream
) -> None:
    successes, failures = _successes(server, "square_int32"), _failures(server, "square_int32")
    for value, request_id in ((-1, "sent-an-error"), (-2, "execute-raised")):
        stream.client.async_stream_infer(
            "square_int32", [_input("IN", [value])], request_id=request_id
        )
        ((result, error),) = stream.take(1)
        assert result is None and error is not None
    assert _failures(server, "square_int32") - failures == 2
    assert _successes(server, "square_int32") == successes
    stream.client.async_stream_infer("square_int32", [_input("IN", [1])])
    ((result, error),) = stream.take(1)  # and it serves on
    assert error is None and result.as_numpy("OUT").tolist() == [1]
