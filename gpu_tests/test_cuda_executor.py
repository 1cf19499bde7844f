"""ONNX Runtime's CUDA provider through IO binding, where this onnxruntime has it (the
``gpu`` extras install onnxruntime-gpu; a CPU onnxruntime skips this file). Results match a
CPU run; device and pinned memory stay flat over 1,000 executions."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from google.protobuf import text_format

from backends.base import Placement
from backends.onnxruntime.backend import OnnxRuntimeBackend
from server.cuda.host_register import register_with_cuda, unregister_from_cuda
from server.generated import model_config_pb2 as mc
from server.ipc.tensors import LentBlocks, Outbox
from server.memory.arena import Arena, ArenaAllocator
from server.memory.device_pool import DevicePools
from server.memory.host_pool import HostBufferPool

pytestmark = pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="this onnxruntime has no CUDA execution provider",
)
# The test model is built with the onnx package, a test dependency only (scripts/gpu_wheels.sh
# carries it to the GPU machine): without it this file is skipped, the rest of gpu_tests runs.
make_models = pytest.importorskip("scripts.make_models", reason="needs the onnx package")

CONFIG = """name: "mlp" max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] } ]"""
GPU = Placement(mc.ModelInstanceGroup.KIND_GPU, 0)
CPU = Placement(mc.ModelInstanceGroup.KIND_CPU)


@pytest.fixture(scope="module")
def mlp_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("cuda") / "mlp" / "1" / "model.onnx"
    saved: Path = make_models.save(make_models.mlp(), path)
    return saved


def test_cuda_instance_matches_the_cpu(mlp_file: Path) -> None:
    pools = DevicePools(lambda device: 64 << 20)
    backend = OnnxRuntimeBackend({}, pools)
    assert backend.gpu_count() >= 1
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    gpu = backend.load_instance(mlp_file, config, GPU)
    cpu = backend.load_instance(mlp_file, config, CPU)
    rng = np.random.default_rng(0)
    for rows in (1, 7, 32):
        x = rng.standard_normal((rows, 256)).astype(np.float32)
        got = gpu.execute({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
        want = cpu.execute({"INPUT0": x}, ["OUTPUT0"])["OUTPUT0"]
        assert got.shape == want.shape == (rows, 10)
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)  # TF32 may be on
    gpu.close()
    cpu.close()


def test_a_batch_joined_on_the_device_matches_the_cpu(mlp_file: Path) -> None:
    """Each request's rows copied into their slice of the device buffer, from pinned pool
    buffers as the transports hand them over."""
    host_pool = HostBufferPool()
    backend = OnnxRuntimeBackend({}, DevicePools(lambda device: 64 << 20), host_pool)
    config = text_format.Parse(CONFIG, mc.ModelConfig())
    gpu = backend.load_instance(mlp_file, config, GPU)
    cpu = backend.load_instance(mlp_file, config, CPU)
    assert gpu.joins_on_device
    rng = np.random.default_rng(1)
    buffers, parts = [], []
    for rows in (1, 3, 7, 2):
        buffer = host_pool.acquire(rows * 256 * 4)
        assert buffer.pinned
        part = np.frombuffer(buffer.view, np.float32).reshape(rows, 256)
        part[...] = rng.standard_normal((rows, 256))
        buffers.append(buffer)
        parts.append(part)
    got = gpu.execute_parts({"INPUT0": parts}, ["OUTPUT0"])["OUTPUT0"]
    want = cpu.execute({"INPUT0": np.concatenate(parts)}, ["OUTPUT0"])["OUTPUT0"]
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)
    for buffer in buffers:
        buffer.release()
    gpu.close()
    cpu.close()


IDENTITY = """name: "ident" max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]"""


def test_a_large_output_is_copied_from_the_device_into_the_result_arena(tmp_path: Path) -> None:
    """A request run alone in the executor offers blocks of its front end's result arena
    (pinned there): the device-to-host copy lands in one, where the front end writes it to the
    client from, and nowhere else."""
    path = make_models.save(make_models.identity("FP32", ["batch", -1]), tmp_path / "id.onnx")
    host_pool = HostBufferPool()
    backend = OnnxRuntimeBackend({}, DevicePools(lambda device: 64 << 20), host_pool)
    gpu = backend.load_instance(path, text_format.Parse(IDENTITY, mc.ModelConfig()), GPU)
    x = np.random.default_rng(2).standard_normal((1, 4 << 20)).astype(np.float32)  # 16 MiB
    with Arena.create(64 << 20) as arena:
        assert register_with_cuda(arena), "cudaHostRegister refused the arena (see the warning)"
        try:
            allocator = ArenaAllocator(arena.size)
            outbox = Outbox(arena.array, allocator.allocate)
            lent = LentBlocks(outbox, allocator.free)
            got = gpu.execute_into({"INPUT0": x}, ["OUTPUT0"], lent)["OUTPUT0"]
            np.testing.assert_array_equal(got, x)
            assert outbox.offset_of(got) is not None, "fetched into the arena"
            assert allocator.bytes_in_use == x.nbytes
            assert host_pool.stats().allocations == 0, "and into no pool buffer"
            del got
            lent.reclaim()
            assert allocator.bytes_in_use == 0
        finally:
            unregister_from_cuda(arena)
    gpu.close()


def test_memory_is_flat_over_1000_executions(mlp_file: Path) -> None:
    pools = DevicePools(lambda device: 64 << 20)
    host_pool = HostBufferPool()
    backend = OnnxRuntimeBackend({}, pools, host_pool)
    instance = backend.load_instance(mlp_file, text_format.Parse(CONFIG, mc.ModelConfig()), GPU)
    x = np.ones((32, 256), np.float32)
    for index in range(1_000):
        instance.execute({"INPUT0": x}, ["OUTPUT0"])
        if index == 10:
            device_then = pools.usage()[0]
            allocations_then = host_pool.stats().allocations
    assert pools.usage()[0] == device_then
    stats = host_pool.stats()
    assert stats.allocations == allocations_then, "output buffers are reused"
    assert stats.pinned_used == 0, "every output buffer went back"
    instance.close()
