"""CudaDevice's input side against the CuPy stand-in: how a batch reaches the device.

A batch's parts are copied once each, on the instance's stream, into their rows of one reused
device buffer, which is bound by address with the real element type; a lone input already on
the instance's GPU (CUDA shared memory) is bound where it is, with no copy. gpu_tests/ runs the
same code on a real GPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

from backends.onnxruntime.backend import OnnxRuntimeInstance, _signature
from backends.onnxruntime.iobinding import CudaDevice, HostDevice, IoBindingInstance
from backends.onnxruntime.ort_types import ONNX_BFLOAT16
from scripts import make_models
from server.ipc.tensors import LentBlocks, Outbox
from server.memory.arena import ArenaAllocator
from server.memory.host_pool import HostBufferPool
from tests.fake_cupy import FakeArray, FakeCupy


class Binding:
    """An IOBinding that records what is bound."""

    def __init__(self) -> None:
        self.inputs: dict[str, tuple[str, int, Any, list[int], int]] = {}

    def bind_input(
        self, name: str, device: str, device_id: int, element: Any, shape: list[int], ptr: int
    ) -> None:
        self.inputs[name] = (device, device_id, element, shape, ptr)


class Pools:
    """DevicePools that hands out stand-in device memory and counts what it hands out."""

    def __init__(self, cupy: FakeCupy) -> None:
        self._cupy = cupy
        self.allocations: list[int] = []

    def empty(self, device: int, nbytes: int) -> FakeArray:
        self.allocations.append(nbytes)
        return self._cupy.empty(nbytes, np.uint8)


@pytest.fixture
def fake() -> FakeCupy:
    return FakeCupy()


def _device(fake: FakeCupy, device_id: int = 0) -> tuple[CudaDevice, Pools]:
    pools = Pools(fake)
    stream = fake.cuda.Stream(non_blocking=True)
    device = CudaDevice(fake, device_id, stream, pools, HostBufferPool())  # type: ignore[arg-type]
    return device, pools


def _bound(fake: FakeCupy, device: CudaDevice, name: str, binding: Binding) -> np.ndarray:
    """What the device memory at the bound address holds, read through the stand-in."""
    _, _, _, shape, ptr = binding.inputs[name]
    buffer = device._buffers[name]
    assert buffer.data.ptr == ptr, "bound at the start of the reused buffer"
    count = int(np.prod(shape))
    held: np.ndarray = buffer.host.view(np.float32)[:count].reshape(shape)
    return held


def test_parts_are_copied_into_their_rows_of_one_buffer(fake: FakeCupy) -> None:
    device, pools = _device(fake)
    parts = [np.full((rows, 3), float(rows), np.float32) for rows in (1, 2, 1)]
    binding = Binding()
    fake.events.clear()
    device.bind_input(binding, "x", parts)
    assert fake.events == [
        "device 0 on", "stream on", *["H2D float32 stream"] * 3, "stream off", "device 0 off"
    ]
    assert binding.inputs["x"][:4] == ("cuda", 0, np.float32, [4, 3])
    np.testing.assert_array_equal(_bound(fake, device, "x", binding), np.concatenate(parts))
    assert pools.allocations == [64], "48 bytes, in a power-of-two buffer"


def test_the_buffer_is_reused_and_grown_by_powers_of_two(fake: FakeCupy) -> None:
    device, pools = _device(fake)
    binding = Binding()
    device.bind_input(binding, "x", [np.ones((4, 4), np.float32)])
    first = binding.inputs["x"][4]
    device.bind_input(binding, "x", [np.ones((1, 4), np.float32), np.ones((2, 4), np.float32)])
    assert binding.inputs["x"][4] == first and pools.allocations == [64]
    device.bind_input(binding, "x", [np.ones((5, 4), np.float32)])
    assert pools.allocations == [64, 128]


def test_a_lone_input_on_this_gpu_is_bound_in_place(fake: FakeCupy) -> None:
    device, pools = _device(fake, device_id=1)
    shared = fake.device_array(np.arange(6, dtype=np.float32).reshape(2, 3), device_id=1)
    binding = Binding()
    fake.events.clear()
    device.bind_input(binding, "x", [shared])
    assert binding.inputs["x"] == ("cuda", 1, np.float32, [2, 3], shared.data.ptr)
    assert fake.events == ["device 1 on", "device 1 off"], "no copy"
    assert pools.allocations == []


def test_device_parts_elsewhere_or_in_a_batch_are_copied_device_to_device(
    fake: FakeCupy,
) -> None:
    device, _ = _device(fake, device_id=0)
    other_gpu = fake.device_array(np.full((2, 2), 7.0, np.float32), device_id=1)
    binding = Binding()
    fake.events.clear()
    device.bind_input(binding, "x", [other_gpu])
    assert "D2D 16 stream" in fake.events
    np.testing.assert_array_equal(_bound(fake, device, "x", binding), np.full((2, 2), 7.0))
    mixed = [np.zeros((1, 2), np.float32), fake.device_array(np.ones((1, 2), np.float32))]
    device.bind_input(binding, "x", mixed)
    np.testing.assert_array_equal(_bound(fake, device, "x", binding), [[0, 0], [1, 1]])


def test_bf16_is_held_as_uint16_and_bound_as_bf16(fake: FakeCupy) -> None:
    device, _ = _device(fake)
    values = np.array([[1.5, -2.0]], dtype=ml_dtypes.bfloat16)
    binding = Binding()
    device.bind_input(binding, "h", [values, values])
    assert binding.inputs["h"][2:4] == (ONNX_BFLOAT16, [2, 2])
    held = device._buffers["h"].host.view(np.uint16)[:4].reshape(2, 2)
    np.testing.assert_array_equal(held.view(ml_dtypes.bfloat16), np.concatenate([values] * 2))


class DeviceValue:
    """An output ONNX Runtime left on the GPU (an ``OrtValue``): its bytes are numpy here."""

    def __init__(self, array: np.ndarray) -> None:
        self.array = array

    def device_name(self) -> str:
        return "Cuda"

    def data_type(self) -> str:
        return "tensor(float)"

    def shape(self) -> list[int]:
        return list(self.array.shape)

    def data_ptr(self) -> int:
        return int(self.array.ctypes.data)


def _reads_device_values(fake: FakeCupy) -> None:
    """Give the stand-in what ``CudaDevice.fetch`` wraps an output's device memory with."""

    def wrap(shape: tuple[int, ...], dtype: Any, pointer: DeviceValue) -> FakeArray:
        return FakeArray(pointer.array.view(dtype).reshape(shape), fake.events)

    fake.cuda.UnownedMemory = lambda ptr, size, owner, device_id: owner
    fake.cuda.MemoryPointer = lambda memory, offset: memory
    fake.ndarray = wrap  # type: ignore[assignment]


def test_outputs_are_fetched_into_the_memory_offered_or_the_pool(fake: FakeCupy) -> None:
    """A large output of a run offered memory comes back into it (the result arena, in the
    executor), a small one into numpy memory; without an offer a large one goes to the pool.
    Every copy has landed when fetch returns."""
    device, _ = _device(fake)
    allocator = ArenaAllocator(1 << 20)
    outbox = Outbox(np.zeros(1 << 20, np.uint8), allocator.allocate)
    lent = LentBlocks(outbox, allocator.free)
    large = np.arange(1 << 14, dtype=np.float32).reshape(2, 1 << 13)  # 64 KiB
    small = np.ones((1, 4), np.float32)
    values: Any = [DeviceValue(large), DeviceValue(small)]
    _reads_device_values(fake)
    fake.events.clear()
    got_large, got_small = device.fetch(values, lent)
    assert fake.events == [
        "device 0 on", "to host", "to host", "synchronize", "device 0 off"
    ]
    np.testing.assert_array_equal(got_large, large)
    np.testing.assert_array_equal(got_small, small)
    assert outbox.offset_of(got_large) is not None and allocator.bytes_in_use == large.nbytes
    assert outbox.offset_of(got_small) is None
    lent.reclaim()
    pooled, _ = device.fetch(values)
    np.testing.assert_array_equal(pooled, large)
    assert outbox.offset_of(pooled) is None and allocator.bytes_in_use == 0


def test_after_a_failure_the_stream_is_waited_for_and_inputs_let_go(fake: FakeCupy) -> None:
    """A request's buffers (a CUDA region among them) are released once the instance gives up
    on its run: nothing queued may still read them then."""
    device, _ = _device(fake)
    shared = fake.device_array(np.ones((2, 2), np.float32))
    device.bind_input(Binding(), "x", [shared])
    assert device._held == [shared]
    fake.events.clear()
    device.abandon()
    assert fake.events == ["synchronize"] and device._held == []


def test_gpu_instances_never_run_on_the_event_loop(fake: FakeCupy, tmp_path: Path) -> None:
    """A GPU run waits for its stream, so the runner keeps it on the worker thread even when
    it is fast (the direct scheduler's path); host binding may run inline."""
    path = make_models.save(make_models.add_sub("FP32"), tmp_path / "m.onnx")
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    fallback = OnnxRuntimeInstance(session, _signature(session, "m"))
    gpu = IoBindingInstance(session, _device(fake)[0], fallback)
    host = IoBindingInstance(session, HostDevice(), fallback)
    assert (gpu.may_run_inline, gpu.joins_on_device) == (False, True)
    assert (host.may_run_inline, host.joins_on_device) == (True, False)
