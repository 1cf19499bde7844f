"""The sequence batcher on the real server, driven the way NVIDIA's sequence example clients
drive Triton (``simple_http_sequence_sync_infer_client.py``,
``simple_grpc_sequence_sync_infer_client.py``, ``simple_grpc_sequence_stream_infer_client.py``,
with and without ``-d``): two integer sequences and one string-id sequence, their requests
numbered, START on the first and END on the last, checked value by value as those clients
check them. Then the refusals, with Triton's texts, and the idle timeout."""

from __future__ import annotations

import json
import queue
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any, cast

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from scripts import make_models
from tests.sequence_models import (
    SIMPLE_SEQUENCE,
    SIMPLE_STRING_DYNA_SEQUENCE,
    build_python_sequence,
    build_sequence_repository,
    row,
    simple_sequence_model,
    string_dyna_sequence_model,
)
from tests.server_process import ServerProcess, start_server

VALUES = [11, 7, 5, 3, 2, 0, 1]
IDLE_US = 300_000


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = build_sequence_repository(tmp_path_factory.mktemp("sequence_repo"))
    config = SIMPLE_SEQUENCE.format(idle=IDLE_US, count=1)
    make_models.save(simple_sequence_model(), root / "short_idle" / "1" / "model.onnx")
    # warmed up with the controls its sample sets (the model needs them: ONNX inputs)
    warmup = ", ".join(
        f'{{ key: "{name}" value: {{ data_type: TYPE_INT32 dims: [ 1 ] zero_data: true }} }}'
        for name in ("INPUT", "START", "READY")
    )
    make_models.write_text(
        config.replace('"simple_sequence"', '"short_idle"')
        + f'model_warmup [ {{ name: "w" batch_size: 1 inputs [ {warmup} ] }} ]\n',
        root / "short_idle" / "config.pbtxt",
    )
    build_python_sequence(root)
    # the string-id accumulator again, its state starting from 1000 (an initial_state file)
    make_models.save(string_dyna_sequence_model(), root / "from_1000" / "1" / "model.onnx")
    make_models.write_text(
        SIMPLE_STRING_DYNA_SEQUENCE.format()
        .replace('"simple_string_dyna_sequence"', '"from_1000"')
        .replace(
            'TYPE_INT32 dims: [ 1 ] } ]\n}',
            'TYPE_INT32 dims: [ 1 ] initial_state [ { data_type: TYPE_INT32 dims: [ 1 ] '
            'data_file: "acc.bin" } ] } ]\n}',
        ),
        root / "from_1000" / "config.pbtxt",
    )
    (root / "from_1000" / "initial_state").mkdir()
    (root / "from_1000" / "initial_state" / "acc.bin").write_bytes(
        np.array([1000], "<i4").tobytes()
    )
    process = start_server(root)
    assert process.port is not None and process.grpc_port is not None, process.log
    yield process
    process.stop()


def _ids(dyna: bool) -> tuple[int, int, str]:
    """The example clients' sequence ids: 1000 and 1001, and a string one (decimal for the
    dyna models, whose CORRID is that number; a UUID otherwise)."""
    return 1000, 1001, "1002" if dyna else str(uuid.uuid4())


def _check(dyna: bool, results: tuple[list[int], list[int], list[int]]) -> None:
    """The example clients' expectations, value by value."""
    int0, int1, string0 = results
    seq0, seq1, seq2 = _ids(dyna)
    assert len(int0) == len(int1) == len(string0) == len(VALUES) + 1
    for i in range(len(int0)):
        expected0 = 1 if i == 0 else VALUES[i - 1]
        expected1 = 101 if i == 0 else -VALUES[i - 1]
        if i == 0:
            expected2 = 20 if dyna else 21
        elif dyna:
            expected2 = -VALUES[i - 1] + string0[i - 1]
        else:
            expected2 = -VALUES[i - 1]
        if dyna and i != 0 and VALUES[i - 1] == 1:  # the END request adds the CORRID
            expected0 += seq0
            expected1 += seq1
            expected2 += int(seq2)
        assert (int0[i], int1[i], string0[i]) == (expected0, expected1, expected2), i


def _models(dyna: bool) -> tuple[str, str]:
    if dyna:
        return "simple_dyna_sequence", "simple_string_dyna_sequence"
    return "simple_sequence", "simple_sequence"


def _sync_send(
    client: Any, module: Any, model: str, values: list[int], sequence_id: int | str
) -> list[int]:
    results = []
    for count, value in enumerate(values, start=1):
        tensor = module.InferInput("INPUT", [1, 1], "INT32")
        tensor.set_data_from_numpy(row(value))
        result = client.infer(
            model,
            [tensor],
            outputs=[module.InferRequestedOutput("OUTPUT")],
            sequence_id=sequence_id,
            sequence_start=count == 1,
            sequence_end=count == len(values),
        )
        results.append(int(result.as_numpy("OUTPUT")[0][0]))
    return results


@pytest.mark.parametrize("dyna", [False, True])
@pytest.mark.parametrize("transport", ["http", "grpc"])
def test_sync_sequence_clients(server: ServerProcess, transport: str, dyna: bool) -> None:
    if transport == "http":
        module: Any = httpclient
        client = httpclient.InferenceServerClient(server.url)
    else:
        module, client = grpcclient, grpcclient.InferenceServerClient(server.grpc_url)
    int_model, string_model = _models(dyna)
    seq0, seq1, seq2 = _ids(dyna)
    try:
        results = (
            _sync_send(client, module, int_model, [0, *VALUES], seq0),
            _sync_send(client, module, int_model, [100, *(-v for v in VALUES)], seq1),
            _sync_send(client, module, string_model, [20, *(-v for v in VALUES)], seq2),
        )
    finally:
        client.close()
    _check(dyna, results)


@pytest.mark.parametrize("dyna", [False, True])
def test_grpc_stream_sequence_client(server: ServerProcess, dyna: bool) -> None:
    """All three sequences sent at once on one stream, told apart by their request ids."""
    completed: queue.Queue[Any] = queue.Queue()

    def callback(result: Any, error: Any) -> None:
        completed.put(error if error else result)

    int_model, string_model = _models(dyna)
    seq0, seq1, seq2 = _ids(dyna)
    sends = [
        (int_model, [0, *VALUES], seq0),
        (int_model, [100, *(-v for v in VALUES)], seq1),
        (string_model, [20, *(-v for v in VALUES)], seq2),
    ]
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        client.start_stream(callback=callback)
        for model, values, sequence_id in sends:
            for count, value in enumerate(values, start=1):
                tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
                tensor.set_data_from_numpy(row(value))
                client.async_stream_infer(
                    model_name=model,
                    inputs=[tensor],
                    outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
                    request_id=f"{sequence_id}_{count}",
                    sequence_id=sequence_id,
                    sequence_start=count == 1,
                    sequence_end=count == len(values),
                )
        by_id: dict[str, dict[int, int]] = {str(seq0): {}, str(seq1): {}, seq2: {}}
        for _ in range(3 * (len(VALUES) + 1)):
            item = completed.get(timeout=30)
            assert not isinstance(item, InferenceServerException), item.message()
            sequence, count = item.get_response().id.rsplit("_", 1)
            by_id[sequence][int(count)] = int(item.as_numpy("OUTPUT")[0][0])
        client.stop_stream()
    _check(dyna, tuple([by_id[key][c] for c in sorted(by_id[key])] for key in by_id))  # type: ignore[arg-type]


def test_concurrent_sequences_each_get_their_own_answers(server: ServerProcess) -> None:
    """Eight sequences at once, each from its own thread (Direct: one slot each of the
    instance's eight, batched together as they come): every answer is its own sequence's,
    each request is counted once, and no execution ran more than the eight slots."""
    model = "simple_sequence"
    before = _stats(server, model)
    results: dict[int, list[int]] = {}

    def run(sequence_id: int) -> None:
        with httpclient.InferenceServerClient(server.url) as client:
            values = [sequence_id * 10 + i for i in range(12)]
            results[sequence_id] = _sync_send(client, httpclient, model, values, sequence_id)

    threads = [threading.Thread(target=run, args=(sid,)) for sid in range(1, 9)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for sequence_id in range(1, 9):
        values = [sequence_id * 10 + i for i in range(12)]
        assert results[sequence_id] == [values[0] + 1, *values[1:]]
    after = _stats(server, model)
    assert after["inference_count"] - before["inference_count"] == 96
    executions = after["execution_count"] - before["execution_count"]
    assert 12 <= executions <= 96  # each sequence's 12 requests ran one after the other
    sizes = {int(b["batch_size"]) for b in after["batch_stats"]}
    assert sizes <= set(range(1, 9)), sizes


def test_sequential_requests_are_counted_one_execution_each(server: ServerProcess) -> None:
    model = "simple_dyna_sequence"
    before = _stats(server, model)
    with httpclient.InferenceServerClient(server.url) as client:
        _sync_send(client, httpclient, model, [1, 2, 3], 77)
    after = _stats(server, model)
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 3
    assert after["inference_stats"]["success"]["count"] - before["inference_stats"][
        "success"]["count"] == 3


def _stats(server: ServerProcess, model: str) -> dict[str, Any]:
    status, _, body = server.request("GET", f"/v2/models/{model}/stats")
    assert status == 200, body
    stats: dict[str, Any] = json.loads(body)["model_stats"][0]
    return stats


def test_metadata_lists_only_the_client_inputs(server: ServerProcess) -> None:
    """Control and state inputs are the scheduler's: not in the metadata, as in Triton."""
    with httpclient.InferenceServerClient(server.url) as client:
        for model in ("simple_sequence", "simple_dyna_sequence", "simple_string_dyna_sequence"):
            meta = client.get_model_metadata(model)
            assert [t["name"] for t in meta["inputs"]] == ["INPUT"]
            assert [t["name"] for t in meta["outputs"]] == ["OUTPUT"]
        config = client.get_model_config("simple_string_dyna_sequence")
        sequence = config["sequence_batching"]
        assert [c["name"] for c in sequence["control_input"]] == [
            "START", "END", "READY", "CORRID"
        ]
        assert sequence["state"][0]["input_name"] == "ACC_IN"
        assert client.get_model_config("simple_dyna_sequence")["sequence_batching"][
            "max_sequence_idle_microseconds"] == 1_000_000
        extensions = client.get_server_metadata()["extensions"]
    assert "sequence" in extensions and "sequence(string_id)" in extensions
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        assert "sequence" in client.get_server_metadata().extensions


def _http_error(server: ServerProcess, model: str, parameters: dict[str, Any],
                inputs: list[dict[str, Any]] | None = None) -> tuple[int, str]:
    body = {
        "inputs": inputs or [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [1]}],
        "parameters": parameters,
    }
    status, _, reply = server.request("POST", f"/v2/models/{model}/infer", json.dumps(body))
    message: str = json.loads(reply)["error"]
    return status, message


def test_refusals_have_tritons_texts(server: ServerProcess) -> None:
    model = "simple_sequence"
    assert _http_error(server, model, {}) == (
        400,
        (f"inference request to model '{model}' must specify a non-zero or non-empty "
         "correlation ID"),
    )
    assert _http_error(server, model, {"sequence_id": ""})[1].endswith(
        "must specify a non-zero or non-empty correlation ID"
    )
    assert _http_error(server, model, {"sequence_id": 4242}) == (
        400,
        (f"inference request for sequence 4242 to model '{model}' must specify the START flag "
         "on the first request of the sequence"),
    )
    assert _http_error(server, model, {"sequence_id": "abc", "sequence_end": True}) == (
        400,
        (f"inference request for sequence abc to model '{model}' must specify the START flag "
         "on the first request of the sequence"),
    )
    two_rows = [{"name": "INPUT", "shape": [2, 1], "datatype": "INT32", "data": [1, 2]}]
    assert _http_error(server, model, {"sequence_id": 5, "sequence_start": True}, two_rows) == (
        400,
        (f"inference request to model '{model}' must specify batch-size 1 due to requirements "
         "of sequence batcher"),
    )
    start = [*_one(1), {"name": "START", "shape": [1, 1], "datatype": "INT32", "data": [1]}]
    status, message = _http_error(server, model, {"sequence_id": 5, "sequence_start": True}, start)
    assert (status, message) == (400, f"unexpected inference input 'START' for model '{model}'")
    for params, key in (
        ({"sequence_id": -1}, "sequence_id"),
        ({"sequence_id": 1.5}, "sequence_id"),
        ({"sequence_id": True}, "sequence_id"),
        ({"sequence_id": 1, "sequence_start": 1}, "sequence_start"),
        ({"sequence_id": 1, "sequence_end": "yes"}, "sequence_end"),
    ):
        assert _http_error(server, model, params) == (400, f"Unable to parse '{key}'")
    # The model serves on.
    with httpclient.InferenceServerClient(server.url) as client:
        assert _sync_send(client, httpclient, model, [3, 4], 9) == [4, 4]


def _one(value: int) -> list[dict[str, Any]]:
    return [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}]


def test_grpc_refusals(server: ServerProcess) -> None:
    from tritonclient.grpc import service_pb2

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        stub = client._client_stub

        def infer(**params: Any) -> str:
            request = service_pb2.ModelInferRequest(model_name="simple_sequence")
            request.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
            request.raw_input_contents.append(row(1).tobytes())
            for key, (kind, value) in params.items():
                setattr(request.parameters[key], kind, value)
            with pytest.raises(Exception) as caught:
                stub.ModelInfer(request)
            return str(cast(grpc.RpcError, caught.value).details())

        assert infer(sequence_id=("double_param", 1.0)) == (
            "invalid value type for 'sequence_id' parameter, expected int64_param, "
            "uint64_param or string_param."
        )
        assert infer(sequence_id=("int64_param", 5), sequence_start=("int64_param", 1)) == (
            "invalid value type for 'sequence_start' parameter, expected bool_param."
        )
        assert infer(sequence_id=("uint64_param", 6)).endswith(
            "must specify the START flag on the first request of the sequence"
        )
        # uint64 ids beyond int64 are sequence ids too (tritonclient sends int64 only)
        request = service_pb2.ModelInferRequest(model_name="simple_sequence")
        request.inputs.add(name="INPUT", datatype="INT32", shape=[1, 1])
        request.raw_input_contents.append(row(5).tobytes())
        request.parameters["sequence_id"].uint64_param = (1 << 64) - 1
        request.parameters["sequence_start"].bool_param = True
        request.parameters["sequence_end"].bool_param = True
        reply = stub.ModelInfer(request)
        assert np.frombuffer(reply.raw_output_contents[0], dtype=np.int32).tolist() == [6]


def test_a_new_start_ends_the_previous_sequence(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        send = partial(_send_one, client, "simple_string_dyna_sequence", "31")
        assert send(5, start=True) == 5
        assert send(6) == 11
        assert send(7, start=True) == 7  # the state starts again from zeros
        assert send(1, end=True) == 8 + 31
    server.wait_for_log("sequence 31 for model 'simple_string_dyna_sequence' has a conflict")


def _send_one(client: Any, model: str, sequence_id: int | str, value: int,
              start: bool = False, end: bool = False) -> int:
    tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(row(value))
    result = client.infer(
        model, [tensor], sequence_id=sequence_id, sequence_start=start, sequence_end=end
    )
    return int(result.as_numpy("OUTPUT")[0][0])


def test_a_sequence_model_warms_up_with_the_controls_of_its_sample(
    server: ServerProcess,
) -> None:
    """Its ONNX graph needs START and READY: the warmup sample gives them, and the load
    succeeds (the run counts in the statistics, as warmup does)."""
    with httpclient.InferenceServerClient(server.url) as client:
        assert client.is_model_ready("short_idle")
    assert _stats(server, "short_idle")["execution_count"] >= 1


def test_an_idle_sequence_expires(server: ServerProcess) -> None:
    """Past ``max_sequence_idle_microseconds`` without a request its slot is freed, and the
    sequence's next request is refused like one of an unknown sequence."""
    with httpclient.InferenceServerClient(server.url) as client:
        send: Callable[..., int] = partial(_send_one, client, "short_idle", 555)
        assert send(1, start=True) == 2
        assert send(2) == 2  # within the idle time
        time.sleep(3 * IDLE_US / 1e6)
        with pytest.raises(InferenceServerException) as caught:
            send(3)
        assert caught.value.message() == (
            "inference request for sequence 555 to model 'short_idle' must specify the START "
            "flag on the first request of the sequence"
        )
        assert send(4, start=True, end=True) == 5


def test_a_python_model_keeps_its_sums_by_correlation_id(server: ServerProcess) -> None:
    """Two sequences interleaved, from two threads: the python model gets START, END and
    CORRID as inputs, and ``correlation_id()``."""
    results: dict[int, list[int]] = {}

    def run(sequence_id: int) -> None:
        with httpclient.InferenceServerClient(server.url) as client:
            results[sequence_id] = _sync_send(
                client, httpclient, "py_sequence", [sequence_id, 1, 2, 3, 4], sequence_id
            )

    threads = [threading.Thread(target=run, args=(sid,)) for sid in (40, 50)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert results == {40: [40, 41, 43, 46, 50], 50: [50, 51, 53, 56, 60]}
    with httpclient.InferenceServerClient(server.url) as client:
        assert [t["name"] for t in client.get_model_metadata("py_sequence")["inputs"]] == [
            "INPUT"
        ]


def test_a_state_starts_from_its_initial_state_file(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        send = partial(_send_one, client, "from_1000", "7")
        assert send(1, start=True) == 1001
        assert send(2) == 1003
        assert send(3, start=True, end=True) == 1003 + 7  # restarted from 1000, plus CORRID
