"""IoBindingInstance on the CPU provider (HostDevice): the GPU executor's binding code, run
where CI can run it. Inputs bound by address from pooled, page-aligned buffers (what the HTTP
path hands over) give the same answers as ``session.run``, for every datatype the binding
treats specially (BYTES kept on the host, BF16 by its ONNX element type, FP16), for
non-contiguous inputs, and over many runs without holding on to old inputs."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Sequence
from pathlib import Path

import ml_dtypes
import numpy as np
import onnxruntime as ort
import pytest

from backends.base import Placement
from backends.onnxruntime.backend import OnnxRuntimeBackend, OnnxRuntimeInstance, _signature
from backends.onnxruntime.iobinding import HostDevice, IoBindingInstance
from scripts import make_models
from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.memory.host_pool import HostBufferPool
from server.memory.output_memory import OutputMemory


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _instance(path: Path, device: HostDevice | None = None) -> IoBindingInstance:
    """What the backend builds for a GPU instance, on the host."""
    session = _session(path)
    signature = _signature(session, path.stem)
    strings = frozenset(info.name for info in signature.outputs if info.datatype.is_bytes)
    return IoBindingInstance(
        session, device or HostDevice(), OnnxRuntimeInstance(session, signature), strings
    )


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("iobinding")
    paths = {"add_sub": make_models.save(make_models.add_sub("FP32"), root / "add_sub.onnx")}
    for datatype in ("BYTES", "BF16", "FP16", "INT64"):
        model = make_models.identity(datatype, ["batch", -1])
        paths[datatype] = make_models.save(model, root / f"id_{datatype}.onnx")
    return paths


def _pooled(pool: HostBufferPool, array: np.ndarray) -> np.ndarray:
    """``array`` copied into a pooled buffer, as a request's binary input would be."""
    buffer = pool.acquire(array.nbytes)
    view = np.frombuffer(buffer.view, dtype=array.dtype, count=array.size).reshape(array.shape)
    view[...] = array
    return view


def test_add_sub_from_pooled_buffers_matches_session_run(models: dict[str, Path]) -> None:
    instance = _instance(models["add_sub"])
    session = _session(models["add_sub"])
    pool = HostBufferPool()
    rng = np.random.default_rng(0)
    for rows in (1, 3, 8):
        a = rng.standard_normal((rows, 16)).astype(np.float32)
        b = rng.standard_normal((rows, 16)).astype(np.float32)
        inputs = {"INPUT0": _pooled(pool, a), "INPUT1": _pooled(pool, b)}
        got = instance.execute(inputs, ["OUTPUT1", "OUTPUT0"])
        assert list(got) == ["OUTPUT1", "OUTPUT0"]
        want = session.run(["OUTPUT0", "OUTPUT1"], {"INPUT0": a, "INPUT1": b})
        np.testing.assert_array_equal(got["OUTPUT0"], want[0])
        np.testing.assert_array_equal(got["OUTPUT1"], want[1])


def test_bytes_go_through_the_fallback_byte_exact(models: dict[str, Path]) -> None:
    """ORT cannot bind strings from Python: such runs use plain ``session.run``."""
    instance = _instance(models["BYTES"])
    values = np.array([[b"", b"a\x00b", b"\xff\xfe", "é".encode()]], dtype=object)
    got = instance.execute({"INPUT0": values}, ["OUTPUT0"])["OUTPUT0"]
    assert got.shape == values.shape
    assert list(got.ravel()) == list(values.ravel())


def test_bf16_and_fp16_round_trip_exactly(models: dict[str, Path]) -> None:
    bf16 = np.array([[1.5, -0.0, np.inf, 3.0e38]], dtype=ml_dtypes.bfloat16)
    got = _instance(models["BF16"]).execute(
        {"INPUT0": bf16}, ["OUTPUT0"]
    )["OUTPUT0"]
    assert got.dtype == bf16.dtype
    assert got.tobytes() == bf16.tobytes()
    fp16 = np.array([[0.5, 65504.0, -2.0]], dtype=np.float16)
    got = _instance(models["FP16"]).execute(
        {"INPUT0": fp16}, ["OUTPUT0"]
    )["OUTPUT0"]
    np.testing.assert_array_equal(got, fp16)


def test_non_contiguous_input_is_bound_as_its_values(models: dict[str, Path]) -> None:
    base = np.arange(24, dtype=np.int64).reshape(4, 6)
    strided = base[:, ::2]
    got = _instance(models["INT64"]).execute(
        {"INPUT0": strided}, ["OUTPUT0"]
    )["OUTPUT0"]
    np.testing.assert_array_equal(got, strided)


def test_many_runs_reuse_one_binding_and_hold_no_old_inputs(models: dict[str, Path]) -> None:
    device = HostDevice()
    instance = _instance(models["add_sub"], device)
    one = np.ones((2, 16), np.float32)
    for step in range(1_000):
        got = instance.execute({"INPUT0": one * step, "INPUT1": one}, ["OUTPUT0"])
        assert float(got["OUTPUT0"][1, 15]) == step + 1
        assert device._held == [], "bound inputs must be let go once the run is over"


class Memory:
    """An ``OutputMemory`` (never asked for on the host: what reaches the device counts)."""

    def allocate(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:
        return None


class Fetching(HostDevice):
    """A host device that records the memory each fetch is offered."""

    def __init__(self) -> None:
        super().__init__()
        self.offered: list[OutputMemory | None] = []

    def fetch(
        self, values: Sequence[ort.OrtValue], memory: OutputMemory | None = None
    ) -> list[np.ndarray]:
        self.offered.append(memory)
        return super().fetch(values, memory)


def test_the_memory_offered_to_a_run_reaches_the_devices_fetch(
    models: dict[str, Path],
) -> None:
    """``execute_into`` (a request run alone) and ``execute_parts`` with memory hand it to the
    device, whose fetch copies large outputs into it (on a GPU; see ``server.cuda.copies``)."""
    device = Fetching()
    instance = _instance(models["add_sub"], device)
    a, b = np.ones((1, 16), np.float32), np.full((1, 16), 2.0, np.float32)
    memory = Memory()
    out = instance.execute_into({"INPUT0": a, "INPUT1": b}, ["OUTPUT0"], memory)
    np.testing.assert_array_equal(out["OUTPUT0"], a + b)
    instance.execute_parts({"INPUT0": [a], "INPUT1": [b]}, ["OUTPUT1"], memory)
    instance.execute({"INPUT0": a, "INPUT1": b}, ["OUTPUT0"])
    assert device.offered == [memory, memory, None]


def test_gpu_instances_refused_clearly_on_this_onnxruntime(models: dict[str, Path]) -> None:
    """The CPU onnxruntime has no CUDA provider: KIND_AUTO stays on the CPU (no usable GPU)
    and an explicit KIND_GPU instance fails its load, never silently running on the CPU."""
    backend = OnnxRuntimeBackend({"intra_op_thread_count": "1"})
    assert "CUDAExecutionProvider" not in ort.get_available_providers()
    assert backend.gpu_count() == 0
    config = mc.ModelConfig(name="g", max_batch_size=4)
    with pytest.raises(ModelLoadError, match="KIND_GPU needs a CUDA device and the CUDA"):
        backend.load_instance(
            models["add_sub"], config, Placement(mc.ModelInstanceGroup.KIND_GPU, 0)
        )


def test_close_lets_go_of_the_session_before_the_device(models: dict[str, Path]) -> None:
    """A GPU session computes on its device's stream: closing the instance frees the session
    while the device (and its stream) is still held."""
    session = _session(models["add_sub"])
    signature = _signature(session, "add_sub")
    device = HostDevice()
    instance = IoBindingInstance(session, device, OnnxRuntimeInstance(session, signature))
    freed = weakref.ref(session)
    del session
    instance.close()
    gc.collect()
    assert freed() is None
    assert instance._device is device
