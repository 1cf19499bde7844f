"""CUDA shared memory inputs, against the CuPy stand-in: where their bytes go.

For a model whose instances join batches on their GPUs, a numeric input in a CUDA region is a
device view of the region (no copy, and never through the host); BYTES, BF16, misaligned
views, and models served on the CPU get one device-to-host copy. Registration itself (CUDA IPC)
needs a real GPU: gpu_tests/ covers it.
"""

from __future__ import annotations

import numpy as np
import pytest

from server import dataplane
from server.errors import InvalidArgument
from server.memory.regions import Region
from server.memory.shared_memory import SharedMemoryRegistry
from server.protocol.datatypes import from_name
from server.protocol.shared_memory_params import SharedMemoryRef
from server.protocol.types import InferRequest, InputTensor
from tests.fake_cupy import FakeArray, FakeCupy

VALUES = np.arange(16, dtype=np.float32)


@pytest.fixture
def fake() -> FakeCupy:
    return FakeCupy()


def _registry(fake: FakeCupy) -> SharedMemoryRegistry:
    registry = SharedMemoryRegistry(enabled=True)
    memory = fake.device_array(VALUES.view(np.uint8), device_id=0)
    registry._add(Region("gpu", "cuda", memory.nbytes, memory=memory))
    return registry


def _request(datatype: str, shape: tuple[int, ...], offset: int, byte_size: int) -> InferRequest:
    tensor = InputTensor(
        "IN", from_name(datatype), shape, np.empty(0), shared_memory=SharedMemoryRef(
            "gpu", offset, byte_size
        )
    )
    return InferRequest("m", "", [tensor])


def test_a_device_model_gets_a_view_of_the_region(fake: FakeCupy) -> None:
    request = _request("FP32", (2, 2), 16, 16)
    with _registry(fake).lease({"gpu"}) as lease:
        fake.events.clear()
        dataplane._read_shared_inputs(request, lease, on_device=True)
        data = request.inputs[0].data
        assert isinstance(data, FakeArray)
        assert fake.events == [], "no copy"
        np.testing.assert_array_equal(data.host, [[4, 5], [6, 7]])
        region_memory = lease.regions["gpu"].memory
        assert np.shares_memory(data.host, region_memory.host), "a view of the region"


def test_a_host_model_gets_one_copy(fake: FakeCupy) -> None:
    request = _request("FP32", (4,), 0, 16)
    with _registry(fake).lease({"gpu"}) as lease:
        fake.events.clear()
        dataplane._read_shared_inputs(request, lease, on_device=False)
    data = request.inputs[0].data
    assert isinstance(data, np.ndarray) and fake.events == ["to host"]
    np.testing.assert_array_equal(data, [0, 1, 2, 3])


@pytest.mark.parametrize(
    ("datatype", "shape", "offset", "size"),
    [("BF16", (4,), 0, 8), ("FP32", (2,), 2, 8)],  # a dtype CuPy lacks; a misaligned view
)
def test_what_cannot_stay_on_the_device_is_copied_to_the_host(
    fake: FakeCupy, datatype: str, shape: tuple[int, ...], offset: int, size: int
) -> None:
    request = _request(datatype, shape, offset, size)
    with _registry(fake).lease({"gpu"}) as lease:
        fake.events.clear()
        dataplane._read_shared_inputs(request, lease, on_device=True)
    data = request.inputs[0].data
    assert isinstance(data, np.ndarray) and data.shape == shape
    assert fake.events == ["to host"]
    np.testing.assert_array_equal(
        data.view(np.uint8), VALUES.view(np.uint8)[offset : offset + size]
    )


def test_device_reads_are_bounds_checked(fake: FakeCupy) -> None:
    request = _request("FP32", (4,), 56, 16)
    with _registry(fake).lease({"gpu"}) as lease, pytest.raises(
        InvalidArgument, match="Invalid offset \\+ byte size for shared memory region: 'gpu'"
    ):
        dataplane._read_shared_inputs(request, lease, on_device=True)
