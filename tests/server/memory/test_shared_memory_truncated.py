"""A client that truncates its shared memory object after registering it, over HTTP and gRPC.

Each truncation is a 400 / INVALID_ARGUMENT naming the region and the tensor (never the key
or a path, never a traceback), with an input in the region and with an output in it; the
server then answers a plain request, and a shared memory request again once the client has
given its object back its size. The region starts two pages into its object, so a truncation
to 0 or to one page leaves whole pages of the region past the object's end (a mapping of them
would fault), and one into the middle of the tensor leaves part of its last page (a mapping
would read zeros there instead).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.server_process import EXAMPLES, ServerProcess, start_server

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
SIZE = A.nbytes  # 64
OFFSET = 8192  # the region's offset in its object: two pages
OBJECT_SIZE = OFFSET + SIZE
REGION = "trunc"
REFUSED = ("400", "StatusCode.INVALID_ARGUMENT")
#: What the object is cut to: nothing; less than the region's offset; into the tensor.
TRUNCATIONS = [0, 4096, OFFSET + SIZE // 2]


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = start_server(EXAMPLES, args=("--allow-client-shm=true",))
    assert process.port is not None and process.grpc_port is not None, process.log
    yield process
    process.stop()


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, server: ServerProcess) -> Iterator[Any]:
    module = httpclient if request.param == "http" else grpcclient
    made = module.InferenceServerClient(server.url if request.param == "http" else server.grpc_url)
    yield made
    made.close()


@pytest.fixture
def region(client: Any) -> Iterator[tuple[Any, str]]:
    """A registered region of ``SIZE`` bytes at ``OFFSET`` of its object: (handle, its file)."""
    key = f"/tg_trunc_{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(REGION, key, OBJECT_SIZE)
    client.register_system_shared_memory(REGION, key, SIZE, offset=OFFSET)
    yield handle, f"/dev/shm{key}"
    client.unregister_system_shared_memory()
    shm.destroy_shared_memory_region(handle)


def _module(client: Any) -> Any:
    return httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient


def _infer(client: Any, in_region: bool) -> Any:
    """``simple`` with INPUT0 read from the region (``in_region``), or OUTPUT0 written to it."""
    module = _module(client)
    in0 = module.InferInput("INPUT0", [1, 16], "INT32")
    in1 = module.InferInput("INPUT1", [1, 16], "INT32")
    in1.set_data_from_numpy(B)
    out0 = module.InferRequestedOutput("OUTPUT0")
    if in_region:
        in0.set_shared_memory(REGION, SIZE)
    else:
        in0.set_data_from_numpy(A)
        out0.set_shared_memory(REGION, SIZE)
    return client.infer("simple", [in0, in1], outputs=[out0])


def _exit_status(server: ServerProcess) -> int | None:
    """None while the server runs; its exit status once it has died (-7: SIGBUS)."""
    try:
        return server.proc.wait(5)
    except subprocess.TimeoutExpired:
        return None


def _assert_serving(client: Any) -> None:
    module = _module(client)
    tensors = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    tensors[0].set_data_from_numpy(A)
    tensors[1].set_data_from_numpy(B)
    np.testing.assert_array_equal(client.infer("simple", tensors).as_numpy("OUTPUT0"), A + B)


@pytest.mark.parametrize("size", TRUNCATIONS)
@pytest.mark.parametrize("in_region", [True, False], ids=["input", "output"])
def test_a_truncated_object_is_refused_and_the_server_serves_on(
    server: ServerProcess, client: Any, region: tuple[Any, str], in_region: bool, size: int
) -> None:
    handle, path = region
    shm.set_shared_memory_region(handle, [A], offset=OFFSET)
    os.truncate(path, size)  # the client's mapping of it is not touched until it grows back

    try:
        _infer(client, in_region)
    except Exception as exc:  # noqa: BLE001 - a refusal, or the lost connection of a dead server
        error = exc
    else:
        pytest.fail("the truncated region was used as if it were whole")
    if not (isinstance(error, InferenceServerException) and error.status() in REFUSED):
        pytest.fail(f"no refusal but {error!r}; server exit status {_exit_status(server)}")
    message = str(error.message())
    tensor = "INPUT0" if in_region else "OUTPUT0"
    assert f"shared memory region '{REGION}'" in message and f"'{tensor}'" in message, message
    assert "smaller than registered" in message, message
    assert "tg_trunc" not in message and "/dev/shm" not in message, message
    assert "Traceback" not in message, message
    _assert_serving(client)

    # The client gives the object its size back: the region works again.
    os.truncate(path, OBJECT_SIZE)
    shm.set_shared_memory_region(handle, [A], offset=OFFSET)
    result = _infer(client, in_region)
    if in_region:
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    else:
        got = shm.get_contents_as_numpy(handle, np.int32, [1, 16], offset=OFFSET)
        np.testing.assert_array_equal(got, A + B)
