"""CUDA shared memory: a region made by another process (CUDA IPC handles cannot be opened by
the process that made them) is registered, read as an input and written as an output, and
matches what the socket path gives. Runs only where CuPy sees a device."""

from __future__ import annotations

import multiprocessing
from multiprocessing.connection import Connection

import numpy as np

from server.memory.shared_memory import SharedMemoryRegistry

SIZE = 64


def _owner(pipe: Connection) -> None:
    """Allocate a device buffer holding 0..15 (int32), send its IPC handle, wait, then send
    back what the buffer holds."""
    import cupy

    buffer = cupy.arange(SIZE // 4, dtype=cupy.int32)
    pipe.send(bytes(cupy.cuda.runtime.ipcGetMemHandle(buffer.data.ptr)))
    pipe.recv()  # the parent has read and written
    pipe.send(cupy.asnumpy(buffer).tobytes())


def test_cuda_region_read_and_write() -> None:
    context = multiprocessing.get_context("spawn")
    parent, child = context.Pipe()
    process = context.Process(target=_owner, args=(child,))
    process.start()
    try:
        handle = parent.recv()
        registry = SharedMemoryRegistry(enabled=True)
        assert registry.cuda_available
        registry.register_cuda("gpu", handle, 0, SIZE)
        assert registry.status("cuda", "") == [{"name": "gpu", "device_id": 0, "byte_size": SIZE}]
        with registry.lease({"gpu"}) as lease:
            got = np.frombuffer(lease.read("gpu", 16, 8, "IN"), dtype=np.int32)
            np.testing.assert_array_equal(got, [4, 5])
            in_place = lease.read_on_device("gpu", 16, 8, "IN")  # what GPU instances are given
            assert in_place is not None and in_place.data.ptr % 4 == 0
            np.testing.assert_array_equal(in_place.view(np.int32).get(), [4, 5])
            lease.write(
                "gpu", 0, 8, "OUT",
                memoryview(np.int32([-7, -8]).tobytes()),  # type: ignore[arg-type]
            )
        registry.unregister("cuda", "gpu")
        parent.send("done")
        after = np.frombuffer(parent.recv(), dtype=np.int32)
        np.testing.assert_array_equal(after[:4], [-7, -8, 2, 3])
    finally:
        process.join(30)
