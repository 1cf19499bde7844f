"""System shared memory end to end with NVIDIA's client utilities (tritonclient.utils.
shared_memory), over HTTP and gRPC: inputs read from and outputs written to the client's
regions, every refusal, unregistration during inference, and the extension off by default."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.model_repos import build_slow_repository
from tests.server.http.helpers import assert_simple_ok
from tests.server_process import EXAMPLES, ServerProcess, start_server

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
SIZE = A.nbytes  # 64


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    slow = build_slow_repository(tmp_path_factory.mktemp("shm_slow"), matmuls=24, width=2048)
    process = start_server(EXAMPLES, slow, args=("--allow-client-shm=true",))
    assert process.port is not None and process.grpc_port is not None, process.log
    yield process
    process.stop()


class Regions:
    """Regions made with tritonclient's utilities, destroyed (and unregistered) at the end."""

    def __init__(self) -> None:
        self.handles: list[Any] = []

    def create(self, name: str, size: int) -> tuple[Any, str]:
        key = f"/tg_{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(name, key, size)
        self.handles.append(handle)
        return handle, key

    def destroy(self) -> None:
        for handle in self.handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture
def regions() -> Iterator[Regions]:
    made = Regions()
    yield made
    made.destroy()


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Any]:
    module = httpclient if request.param == "http" else grpcclient
    url = server.url if request.param == "http" else server.grpc_url
    made = module.InferenceServerClient(url)
    made.unregister_system_shared_memory()
    yield made
    made.unregister_system_shared_memory()
    # Whatever the test refused, a plain request still goes through on this transport.
    tensors = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    tensors[0].set_data_from_numpy(A)
    tensors[1].set_data_from_numpy(B)
    np.testing.assert_array_equal(made.infer("simple", tensors).as_numpy("OUTPUT0"), A + B)
    made.close()


def _module(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def test_inputs_and_outputs_through_shared_memory(client: Any, regions: Regions) -> None:
    module = _module(client)
    inputs_handle, inputs_key = regions.create("inputs", 2 * SIZE)
    outputs_handle, outputs_key = regions.create("outputs", 2 * SIZE)
    shm.set_shared_memory_region(inputs_handle, [A, B])
    client.register_system_shared_memory("inputs", inputs_key, 2 * SIZE)
    client.register_system_shared_memory("outputs", outputs_key, 2 * SIZE)
    status = client.get_system_shared_memory_status()
    if isinstance(status, list):  # HTTP: Triton's JSON list
        assert sorted(status, key=lambda r: r["name"]) == [
            {"name": "inputs", "key": inputs_key, "offset": 0, "byte_size": 2 * SIZE},
            {"name": "outputs", "key": outputs_key, "offset": 0, "byte_size": 2 * SIZE},
        ]
    else:  # gRPC: a message with a regions map
        assert sorted(status.regions) == ["inputs", "outputs"]
        assert status.regions["inputs"].key == inputs_key
        assert status.regions["inputs"].byte_size == 2 * SIZE

    in0 = module.InferInput("INPUT0", [1, 16], "INT32")
    in0.set_shared_memory("inputs", SIZE)
    in1 = module.InferInput("INPUT1", [1, 16], "INT32")
    in1.set_shared_memory("inputs", SIZE, offset=SIZE)
    out0 = module.InferRequestedOutput("OUTPUT0")
    out0.set_shared_memory("outputs", SIZE)
    out1 = module.InferRequestedOutput("OUTPUT1")
    out1.set_shared_memory("outputs", SIZE, offset=SIZE)
    result = client.infer("simple", [in0, in1], outputs=[out0, out1])

    got0 = shm.get_contents_as_numpy(outputs_handle, np.int32, [1, 16])
    got1 = shm.get_contents_as_numpy(outputs_handle, np.int32, [1, 16], offset=SIZE)
    np.testing.assert_array_equal(got0, A + B)
    np.testing.assert_array_equal(got1, A - B)
    output = result.get_output("OUTPUT0")
    if isinstance(output, dict):  # HTTP: no data, no parameters (perf_analyzer's C++ client)
        assert output == {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 16]}
    else:  # gRPC: an empty raw_output_contents entry, as Triton
        assert list(output.shape) == [1, 16]
        assert result.get_response().raw_output_contents == [b"", b""]


def test_one_input_in_shared_memory_the_other_in_the_request(
    client: Any, regions: Regions
) -> None:
    module = _module(client)
    handle, key = regions.create("half", SIZE)
    shm.set_shared_memory_region(handle, [A])
    client.register_system_shared_memory("half", key, SIZE)
    in0 = module.InferInput("INPUT0", [1, 16], "INT32")
    in0.set_shared_memory("half", SIZE)
    in1 = module.InferInput("INPUT1", [1, 16], "INT32")
    in1.set_data_from_numpy(B)
    result = client.infer("simple", [in0, in1])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def _error(call: Callable[[], Any]) -> str:
    with pytest.raises(InferenceServerException) as info:
        call()
    return str(info.value.message())


def test_refusals(client: Any, regions: Regions) -> None:
    module = _module(client)
    _, key = regions.create("small", SIZE)
    client.register_system_shared_memory("small", key, SIZE)
    assert "shared memory region 'small' already in manager" in _error(
        lambda: client.register_system_shared_memory("small", key, SIZE)
    )
    assert "Invalid offset + byte size" in _error(
        lambda: client.register_system_shared_memory("big", key, 2 * SIZE)
    )

    def infer(region: str, size: int, offset: int = 0) -> Any:
        in0 = module.InferInput("INPUT0", [1, 16], "INT32")
        in0.set_shared_memory(region, size, offset=offset)
        in1 = module.InferInput("INPUT1", [1, 16], "INT32")
        in1.set_data_from_numpy(B)
        return client.infer("simple", [in0, in1])

    assert "Unable to find shared memory region: 'nope'" in _error(lambda: infer("nope", SIZE))
    assert (
        "input byte size mismatch for input 'INPUT0' for model 'simple'. Expected 64, got 32"
        in _error(lambda: infer("small", 32))
    )
    assert "Invalid offset + byte size" in _error(lambda: infer("small", SIZE, offset=8))
    assert "Invalid offset" in _error(lambda: infer("small", SIZE, offset=1 << 62))
    client.unregister_system_shared_memory("small")
    assert "Unable to find shared memory region: 'small'" in _error(lambda: infer("small", SIZE))


def test_output_cannot_be_both_shared_and_binary(server: ServerProcess) -> None:
    body = {
        "inputs": [
            {"name": n, "shape": [1, 16], "datatype": "INT32", "data": [1] * 16}
            for n in ("INPUT0", "INPUT1")
        ],
        "outputs": [
            {
                "name": "OUTPUT0",
                "parameters": {
                    "binary_data": True,
                    "shared_memory_region": "r",
                    "shared_memory_byte_size": 64,
                },
            }
        ],
    }
    status, _, text = server.request(
        "POST", "/v2/models/simple/infer", json.dumps(body).encode()
    )
    assert status == 400
    assert json.loads(text) == {
        "error": "Output can't set both 'shared_memory_region' and 'binary_data'"
    }
    assert_simple_ok(server)  # the refusal left the server serving


def _slow_successes(server: ServerProcess) -> int:
    status, _, body = server.request("GET", "/v2/models/slow/stats")
    assert status == 200, body
    (entry,) = json.loads(body)["model_stats"]
    count: int = entry["inference_stats"]["success"]["count"]
    return count


def _slow_waiting(server: ServerProcess) -> float:
    """Requests to ``slow`` waiting for its one instance (the pending gauge of /metrics)."""
    for family in text_string_to_metric_families(server.metrics()):
        for sample in family.samples:
            if sample.name == "nv_inference_pending_request_count" and (
                sample.labels.get("model") == "slow"
            ):
                return float(sample.value)
    raise AssertionError("no pending gauge for 'slow'")


def test_unregister_during_inference_completes_after_it(
    server: ServerProcess, regions: Regions
) -> None:
    """The slow model holds the requests for a while; unregistering all regions meanwhile
    hides them at once (the unregister returns before the requests end), and the request that
    named a region still reads its input and answers correctly.

    Two long requests go to the one-instance ``slow`` model: one reading its input from a
    region, one plain. Once one of them waits for the instance (the pending gauge is 1), both
    are in the server, the shared memory one holding its region."""
    rows, width = 256, 2048  # each request keeps the instance busy for half a second or more
    data = np.full((rows, width), 2.0, dtype=np.float32)
    plain = np.full((rows, width), 3.0, dtype=np.float32)
    handle, key = regions.create("slow_in", data.nbytes)
    shm.set_shared_memory_region(handle, [data])
    client = httpclient.InferenceServerClient(server.url)
    try:
        client.register_system_shared_memory("slow_in", key, data.nbytes)
        successes = _slow_successes(server)

        def infer(shared: bool) -> np.ndarray:
            own = httpclient.InferenceServerClient(server.url, network_timeout=120)
            try:
                tensor = httpclient.InferInput("INPUT0", [rows, width], "FP32")
                if shared:
                    tensor.set_shared_memory("slow_in", data.nbytes)
                else:
                    tensor.set_data_from_numpy(plain)
                out: np.ndarray = own.infer("slow", [tensor]).as_numpy("OUTPUT0")
                return out
            finally:
                own.close()

        with ThreadPoolExecutor(2) as pool:
            from_region = pool.submit(infer, True)
            from_body = pool.submit(infer, False)
            deadline = time.monotonic() + 30
            while _slow_waiting(server) < 1:
                assert not from_region.done(), from_region.result()
                assert time.monotonic() < deadline, "the two requests never overlapped"
                time.sleep(0.005)

            gone = threading.Event()

            def unregister() -> None:
                other = httpclient.InferenceServerClient(server.url)
                other.unregister_system_shared_memory()
                gone.set()
                other.close()

            threading.Thread(target=unregister).start()
            # the unregistration does not wait for the request that holds the region...
            assert gone.wait(5)
            assert client.get_system_shared_memory_status() == []
            # ...which is still running or waiting: neither request has finished
            assert _slow_successes(server) == successes
            np.testing.assert_array_equal(from_region.result(timeout=60), data)
            np.testing.assert_array_equal(from_body.result(timeout=60), plain)
        assert _slow_successes(server) == successes + 2
        assert client.get_system_shared_memory_status() == []
    finally:
        client.close()


def test_off_by_default() -> None:
    process = start_server(EXAMPLES)
    try:
        client = httpclient.InferenceServerClient(process.url)
        assert "Client shared memory is disabled" in _error(
            lambda: client.get_system_shared_memory_status()
        )
        client.close()
        status, _, body = process.request("GET", "/v2")
        assert status == 200
        extensions = json.loads(body)["extensions"]
        assert "system_shared_memory" in extensions
        assert "cuda_shared_memory" not in extensions, "no CUDA device here"
        assert_simple_ok(process)
    finally:
        process.stop()
