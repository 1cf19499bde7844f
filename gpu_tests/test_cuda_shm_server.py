"""CUDA shared memory through the real server over HTTP: inputs read from and outputs written
to device buffers of the client, compared with the socket path (binary data), on a KIND_GPU
and a KIND_CPU python model; status, unregistration, and refusals that leave the server up.

The server is another process, so this one can make the device buffers itself and hand their
CUDA IPC handles over (a handle cannot be opened by the process that made it). Each region is
its own ``cudaMalloc`` allocation (``cupy.cuda.Memory``, not CuPy's pool): an IPC handle
stands for a whole allocation and is opened at its start, and one process may open a handle
only once. Runs only where CuPy sees a device (see ``conftest.py``).
"""

from __future__ import annotations

import base64
import http.client
import json
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import server_http

from tests.server_process import ServerProcess

FILL = 0xAB  # every region starts as this byte: what the server must not touch stays so

# The identities return their input itself: the output is a view of the request's own memory
# (its body, or on the GPU maybe the CUDA region it came from).
CPU_IDENTITY = '''class TensorgateModel:
    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
'''
MODELS = {  # name: (instance group, code)
    "affine_gpu": (
        server_http.GPU_GROUP, server_http.checked_model("cupy", server_http.AFFINE)
    ),
    "affine_cpu": (
        server_http.CPU_GROUP, server_http.checked_model("numpy", server_http.AFFINE)
    ),
    "identity_gpu": (server_http.GPU_GROUP, server_http.checked_model("cupy", "x")),
    "identity_cpu": (server_http.CPU_GROUP, CPU_IDENTITY),
}


def _want(model: str, x: np.ndarray) -> np.ndarray:
    """What ``model`` answers for ``x``."""
    return x.copy() if model.startswith("identity") else server_http.affine(x)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("cuda_shm_repo")
    for name, (group, code) in MODELS.items():
        config = server_http.VECTOR_CONFIG.format(name=name, group=group)
        server_http.write_model(root, name, config, code)
    with server_http.serving(root, MODELS, "--allow-client-shm=true") as process:
        _, _, body = server_http.request(process, "GET", "/v2")
        assert "cuda_shared_memory" in json.loads(body)["extensions"], body
        yield process


def _json(server: ServerProcess, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    """A JSON request and its decoded JSON answer (None for an empty one)."""
    payload = None if body is None else json.dumps(body).encode()
    headers = {} if body is None else {"Content-Type": "application/json"}
    status, _, answer = server_http.request(server, method, path, payload, headers)
    return status, json.loads(answer) if answer.strip() else None


class DeviceRegions:
    """Device buffers of this process, each registered (or not) as a CUDA region; at the end
    every CUDA region is unregistered, then the buffers are freed."""

    def __init__(self, server: ServerProcess) -> None:
        import cupy

        self.cupy: Any = cupy
        self.server = server
        self.buffers: dict[str, Any] = {}

    def make(self, name: str, nbytes: int, register: bool = True) -> Any:
        """A uint8 device array of ``nbytes`` filled with ``FILL``, its own allocation."""
        cupy = self.cupy
        with cupy.cuda.Device(0):
            memory = cupy.cuda.Memory(nbytes)
            buffer = cupy.ndarray((nbytes,), cupy.uint8, cupy.cuda.MemoryPointer(memory, 0))
            buffer.fill(FILL)
            cupy.cuda.runtime.deviceSynchronize()
        self.buffers[name] = buffer
        if register:
            status, answer = self.register(name, name, nbytes)
            assert status == 200, (answer, self.server.log[-4000:])
        return buffer

    def handle(self, buffer_name: str) -> bytes:
        buffer = self.buffers[buffer_name]
        return bytes(self.cupy.cuda.runtime.ipcGetMemHandle(buffer.data.ptr))

    def register(self, region: str, buffer_name: str, byte_size: int) -> tuple[int, Any]:
        raw = base64.b64encode(self.handle(buffer_name)).decode()
        body = {"raw_handle": {"b64": raw}, "device_id": 0, "byte_size": byte_size}
        return _json(
            self.server, "POST", f"/v2/cudasharedmemory/region/{region}/register", body
        )

    def write(self, name: str, offset: int, data: np.ndarray) -> None:
        """``data``'s bytes into buffer ``name`` at ``offset``, finished on the device."""
        cupy = self.cupy
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        with cupy.cuda.Device(0):
            self.buffers[name][offset : offset + raw.size] = cupy.asarray(raw)
            cupy.cuda.runtime.deviceSynchronize()

    def read(self, name: str, offset: int, nbytes: int) -> np.ndarray:
        """A host copy of ``nbytes`` of buffer ``name`` at ``offset`` (uint8)."""
        with self.cupy.cuda.Device(0):
            return np.asarray(self.cupy.asnumpy(self.buffers[name][offset : offset + nbytes]))

    def close(self) -> None:
        try:
            status, _ = _json(self.server, "POST", "/v2/cudasharedmemory/unregister")
            assert status == 200
        finally:
            self.cupy.cuda.runtime.deviceSynchronize()
            self.buffers.clear()  # frees the allocations: the server has closed its handles


@pytest.fixture
def regions(server: ServerProcess) -> Iterator[DeviceRegions]:
    made = DeviceRegions(server)
    try:
        yield made
    finally:
        made.close()
    # Whatever the test did, the server is up and answers a plain request.
    server_http.assert_serving(server)
    x = np.arange(8, dtype=np.float32)
    np.testing.assert_array_equal(_socket_infer(server, "affine_gpu", x), server_http.affine(x))


def _shm(region: str, offset: int, byte_size: int) -> dict[str, Any]:
    return {
        "shared_memory_region": region,
        "shared_memory_offset": offset,
        "shared_memory_byte_size": byte_size,
    }


def _infer(
    server: ServerProcess,
    model: str,
    shape: list[int],
    input_params: dict[str, Any],
    output_params: dict[str, Any],
    binary_input: np.ndarray | None = None,
    connection: http.client.HTTPConnection | None = None,
) -> tuple[int, str | None, bytes]:
    """One request whose INPUT0 and OUTPUT0 carry the given parameters; ``binary_input``:
    INPUT0's bytes follow the JSON header."""
    return server_http.post_infer(
        server, model, shape, input_params, {"OUTPUT0": output_params}, binary_input, connection
    )


def _binary_output(header_length: str | None, body: bytes) -> np.ndarray:
    """OUTPUT0 of a binary-data response."""
    outputs = server_http.binary_outputs(header_length, body)
    assert list(outputs) == ["OUTPUT0"] and outputs["OUTPUT0"].dtype == np.float32, outputs
    return outputs["OUTPUT0"]


def _socket_infer(server: ServerProcess, model: str, x: np.ndarray) -> np.ndarray:
    """OUTPUT0 for INPUT0 = ``x``, both over the socket (binary data)."""
    status, header_length, body = _infer(
        server, model, list(x.shape), {"binary_data_size": x.nbytes}, {"binary_data": True}, x
    )
    assert status == 200, (body[:2000], server.log[-4000:])
    return _binary_output(header_length, body)


def _assert_shm_answer(status: int, header_length: str | None, body: bytes, n: int) -> None:
    """A 200 whose OUTPUT0 is in shared memory: JSON only, no data, no parameters."""
    assert status == 200, body[:2000]
    assert header_length is None, body[:500]
    (output,) = json.loads(body)["outputs"]
    assert output == {"name": "OUTPUT0", "datatype": "FP32", "shape": [n]}, output


def _inputs(n: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(n).astype(np.float32)


def test_status_lists_the_regions(server: ServerProcess, regions: DeviceRegions) -> None:
    regions.make("first", 4096)
    regions.make("second", 1 << 20)
    status, listed = _json(server, "GET", "/v2/cudasharedmemory/status")
    assert status == 200, listed
    assert sorted(listed, key=lambda entry: entry["name"]) == [
        {"name": "first", "device_id": 0, "byte_size": 4096},
        {"name": "second", "device_id": 0, "byte_size": 1 << 20},
    ]
    status, one = _json(server, "GET", "/v2/cudasharedmemory/region/second/status")
    assert (status, one) == (200, [{"name": "second", "device_id": 0, "byte_size": 1 << 20}])
    # A name in use is refused before the handle is looked at.
    status, answer = regions.register("first", "second", 1 << 20)
    assert status == 400, answer
    assert "already in manager" in answer["error"], answer
    # The system kind does not list CUDA regions.
    status, system = _json(server, "GET", "/v2/systemsharedmemory/status")
    assert (status, system) == (200, [])


@pytest.mark.parametrize("model", ["affine_gpu", "affine_cpu", "identity_gpu"])
@pytest.mark.parametrize("n", [1000, 600_000])  # 4 kB, and 2.4 MB (off the event loop)
def test_cuda_input_and_output_match_the_socket_path(
    server: ServerProcess, regions: DeviceRegions, model: str, n: int
) -> None:
    x = _inputs(n, seed=n)
    nbytes = x.nbytes
    in_offset, out_offset = 256, 512
    regions.make("in", in_offset + nbytes + 256)
    regions.make("out", out_offset + nbytes + 256)
    regions.write("in", in_offset, x)

    status, header_length, body = _infer(
        server, model, [n], _shm("in", in_offset, nbytes), _shm("out", out_offset, nbytes)
    )
    _assert_shm_answer(status, header_length, body, n)
    got = regions.read("out", out_offset, nbytes).view(np.float32)
    over_socket = _socket_infer(server, model, x)
    np.testing.assert_array_equal(got, over_socket)
    np.testing.assert_array_equal(got, _want(model, x))
    # Nothing around the output was written, and the input was only read.
    assert (regions.read("out", 0, out_offset) == FILL).all()
    assert (regions.read("out", out_offset + nbytes, 256) == FILL).all()
    np.testing.assert_array_equal(regions.read("in", in_offset, nbytes).view(np.float32), x)

    # A second request through the same regions with new input: the new answer.
    y = -x
    regions.write("in", in_offset, y)
    status, header_length, body = _infer(
        server, model, [n], _shm("in", in_offset, nbytes), _shm("out", out_offset, nbytes)
    )
    _assert_shm_answer(status, header_length, body, n)
    np.testing.assert_array_equal(
        regions.read("out", out_offset, nbytes).view(np.float32), _want(model, y)
    )


@pytest.mark.parametrize("model", ["affine_gpu", "affine_cpu", "identity_gpu"])
def test_the_output_is_in_the_region_when_the_answer_arrives(
    server: ServerProcess, regions: DeviceRegions, model: str
) -> None:
    """Back-to-back requests on one connection, each read back from the device the moment its
    answer arrives: the server must have finished writing the region before answering (the
    client's process has no other way to order its read after the server's copy)."""
    n = 1 << 20  # 4 MiB
    nbytes = 4 * n
    regions.make("in", nbytes)
    regions.make("out", nbytes)
    conn = server_http.connect(server)
    try:
        for step in range(10):
            x = np.full(n, step, np.float32)
            x[::7] = -step
            regions.write("in", 0, x)
            status, header_length, body = _infer(
                server, model, [n], _shm("in", 0, nbytes), _shm("out", 0, nbytes),
                connection=conn,
            )
            _assert_shm_answer(status, header_length, body, n)
            got = regions.read("out", 0, nbytes).view(np.float32)
            np.testing.assert_array_equal(got, _want(model, x), err_msg=f"request {step}")
            regions.write("out", 0, np.full(n, np.nan, np.float32))  # no stale answer
    finally:
        conn.close()


@pytest.mark.parametrize("model", ["affine_gpu", "affine_cpu"])
def test_one_region_holds_input_and_output(
    server: ServerProcess, regions: DeviceRegions, model: str
) -> None:
    x = _inputs(4096, seed=7)
    nbytes = x.nbytes
    regions.make("io", 2 * nbytes)
    regions.write("io", 0, x)
    status, header_length, body = _infer(
        server, model, [x.size], _shm("io", 0, nbytes), _shm("io", nbytes, nbytes)
    )
    _assert_shm_answer(status, header_length, body, x.size)
    np.testing.assert_array_equal(regions.read("io", 0, nbytes).view(np.float32), x)
    np.testing.assert_array_equal(
        regions.read("io", nbytes, nbytes).view(np.float32), _socket_infer(server, model, x)
    )


@pytest.mark.parametrize("model", ["identity_cpu", "identity_gpu", "affine_gpu"])
def test_socket_and_cuda_region_mixed(
    server: ServerProcess, regions: DeviceRegions, model: str
) -> None:
    """Input over the socket, output to a CUDA region (for the identity, the output is a view
    of the request body itself); then input from the region, output over the socket."""
    x = _inputs(300_000, seed=11)
    nbytes = x.nbytes
    want = _want(model, x)
    regions.make("out", nbytes)
    for _ in range(3):  # the request body's memory is reused between requests
        status, header_length, body = _infer(
            server, model, [x.size], {"binary_data_size": nbytes}, _shm("out", 0, nbytes), x
        )
        _assert_shm_answer(status, header_length, body, x.size)
        np.testing.assert_array_equal(regions.read("out", 0, nbytes).view(np.float32), want)
        x = x[::-1].copy()
        want = _want(model, x)
        regions.write("out", 0, np.zeros(x.size, np.float32))

    regions.make("in", nbytes)
    regions.write("in", 0, x)
    status, header_length, body = _infer(
        server, model, [x.size], _shm("in", 0, nbytes), {"binary_data": True}
    )
    assert status == 200, body[:2000]
    np.testing.assert_array_equal(_binary_output(header_length, body), want)


def test_out_of_bounds_offsets_are_refused(
    server: ServerProcess, regions: DeviceRegions
) -> None:
    size = 1024
    regions.make("small", size)
    regions.make("out", size)
    n = 16  # 64 bytes
    refusals = [
        # (input parameters, output parameters, what the message says)
        (_shm("small", size, 64), _shm("out", 0, 64), "Invalid offset"),
        (_shm("small", size - 32, 64), _shm("out", 0, 64), "Invalid offset + byte size"),
        (_shm("small", 1 << 62, 64), _shm("out", 0, 64), "Invalid offset"),
        (_shm("small", 0, 64), _shm("out", size, 64), "Invalid offset"),
        (_shm("small", 0, 64), _shm("out", size - 32, 64), "Invalid offset + byte size"),
        (_shm("small", 0, 64), _shm("out", 0, 32), "should be at least 64 bytes"),
        (_shm("small", 0, 32), _shm("out", 0, 64), "Expected 64, got 32"),
    ]
    for model in ("affine_gpu", "affine_cpu"):
        for input_params, output_params, message in refusals:
            status, _, body = _infer(server, model, [n], input_params, output_params)
            assert status == 400, (model, input_params, output_params, body)
            assert message in json.loads(body)["error"], (model, message, body)
    # Refused requests wrote nothing.
    assert (regions.read("out", 0, size) == FILL).all()

    # A region claiming more bytes than its allocation has is refused, and its handle closed
    # again: the same handle registers once with its true size.
    regions.make("big", 4096, register=False)
    status, answer = regions.register("big", "big", 4096 + (64 << 20))
    assert status == 400, answer
    assert "failed to register shared memory region 'big'" in answer["error"], answer
    status, answer = regions.register("big", "big", 4096)
    assert status == 200, (answer, server.log[-4000:])
    # A handle that is not one: refused, nothing registered.
    status, answer = _json(
        server, "POST", "/v2/cudasharedmemory/region/bogus/register",
        {"raw_handle": {"b64": base64.b64encode(bytes(64)).decode()}, "device_id": 0,
         "byte_size": 64},
    )
    assert status == 400, answer
    status, listed = _json(server, "GET", "/v2/cudasharedmemory/status")
    assert sorted(entry["name"] for entry in listed) == ["big", "out", "small"]

    # The regions still work after all that.
    x = _inputs(n, seed=3)
    regions.write("small", 0, x)
    status, header_length, body = _infer(
        server, "affine_gpu", [n], _shm("small", 0, 64), _shm("out", 64, 64)
    )
    _assert_shm_answer(status, header_length, body, n)
    np.testing.assert_array_equal(
        regions.read("out", 64, 64).view(np.float32), server_http.affine(x)
    )


def test_unregister(server: ServerProcess, regions: DeviceRegions) -> None:
    regions.make("kept", 256)
    regions.make("gone", 256)
    status, _ = _json(server, "POST", "/v2/cudasharedmemory/region/gone/unregister")
    assert status == 200
    status, listed = _json(server, "GET", "/v2/cudasharedmemory/status")
    assert (status, listed) == (200, [{"name": "kept", "device_id": 0, "byte_size": 256}])
    status, answer = _json(server, "GET", "/v2/cudasharedmemory/region/gone/status")
    assert status != 200, answer
    status, _, body = _infer(
        server, "affine_gpu", [4], _shm("gone", 0, 16), {"binary_data": True}
    )
    assert status in (400, 404), body
    assert "Unable to find shared memory region: 'gone'" in json.loads(body)["error"], body

    # Its handle was closed: the same buffer registers again and serves.
    status, answer = regions.register("gone", "gone", 256)
    assert status == 200, (answer, server.log[-4000:])
    x = np.arange(4, dtype=np.float32)
    regions.write("gone", 0, x)
    status, header_length, body = _infer(
        server, "affine_cpu", [4], _shm("gone", 0, 16), _shm("kept", 16, 16)
    )
    _assert_shm_answer(status, header_length, body, 4)
    np.testing.assert_array_equal(
        regions.read("kept", 16, 16).view(np.float32), server_http.affine(x)
    )

    # Unregistering every CUDA region empties the list.
    status, _ = _json(server, "POST", "/v2/cudasharedmemory/unregister")
    assert status == 200
    assert _json(server, "GET", "/v2/cudasharedmemory/status") == (200, [])
