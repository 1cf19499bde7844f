"""SharedMemoryRegistry with real POSIX shared memory: registration checks, bounds, leases
that keep a region mapped through unregistration, status, and the off switch."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

from server.errors import InvalidArgument, NotFound, Unsupported
from server.memory.shared_memory import (
    DISABLED,
    AlreadyExists,
    SharedMemoryRegistry,
)


@pytest.fixture
def key() -> Iterator[str]:
    """A 4 KiB shared memory object holding 0..1023 as int32, removed afterwards."""
    name = f"tg_test_{uuid.uuid4().hex}"
    path = f"/dev/shm/{name}"
    with open(path, "wb") as handle:
        handle.write(np.arange(1024, dtype=np.int32).tobytes())
    yield "/" + name
    os.unlink(path)


def test_register_read_write_status(key: str) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("r", key, 64, 256)
    assert registry.status("system", "") == [
        {"name": "r", "key": key, "offset": 64, "byte_size": 256}
    ]
    with registry.lease({"r"}) as lease:
        view = lease.read("r", 16, 8, "IN")
        np.testing.assert_array_equal(np.frombuffer(view, np.int32), [20, 21])
        lease.write("r", 0, 8, "OUT", memoryview(np.int32([-1, -2]).tobytes()))
    with open(f"/dev/shm/{key[1:]}", "rb") as handle:
        data = np.frombuffer(handle.read(), np.int32)
    np.testing.assert_array_equal(data[16:18], [-1, -2])  # offset 64 bytes = element 16
    registry.close()


@pytest.mark.parametrize(
    ("offset", "size", "message"),
    [
        (4096, 4, "Invalid offset for shared memory region"),
        (4000, 200, "Invalid offset \\+ byte size for shared memory region"),
        (-1, 4, "Invalid offset"),
    ],
)
def test_register_bounds(key: str, offset: int, size: int, message: str) -> None:
    with pytest.raises(InvalidArgument, match=message):
        SharedMemoryRegistry(enabled=True).register_system("r", key, offset, size)


@pytest.mark.parametrize("bad", ["/../etc/passwd", "a/b", "", "/", "..", "missing_key_xyz"])
def test_keys_are_plain_names_of_existing_objects(bad: str) -> None:
    with pytest.raises(InvalidArgument, match="failed to register shared memory region 'r'") as err:
        SharedMemoryRegistry(enabled=True).register_system("r", bad, 0, 4)
    assert bad not in str(err.value) or bad == "", "keys are not echoed"


def test_duplicate_names_and_reserved_prefix(key: str) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("r", key, 0, 16)
    with pytest.raises(AlreadyExists, match="shared memory region 'r' already in manager"):
        registry.register_system("r", key, 0, 16)
    with pytest.raises(InvalidArgument, match="reserved prefix"):
        registry.register_system("p", "triton_python_backend_shm_region_1", 0, 16)
    registry.close()


def test_use_is_bounds_checked_per_request(key: str) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("r", key, 0, 128)
    with registry.lease({"r"}) as lease:
        with pytest.raises(InvalidArgument, match="Invalid offset \\+ byte size"):
            lease.read("r", 120, 16, "IN")
        with pytest.raises(InvalidArgument, match="Invalid offset"):
            lease.read("r", 129, 0, "IN")
        with pytest.raises(InvalidArgument, match="should be at least 16 bytes"):
            lease.write("r", 0, 8, "OUT", memoryview(bytes(16)))
    with (
        pytest.raises(NotFound, match="Unable to find shared memory region: 'nope'"),
        registry.lease({"nope"}),
    ):
        pass
    registry.close()


def test_unregister_waits_for_the_requests_using_the_region(key: str) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("r", key, 0, 64)
    with registry.lease({"r"}) as lease:
        registry.unregister("system", "")
        assert registry.status("system", "") == []
        # still readable by the request that holds it
        np.testing.assert_array_equal(np.frombuffer(lease.read("r", 0, 8, "IN"), np.int32), [0, 1])
        with pytest.raises(NotFound), registry.lease({"r"}):
            pass
    with pytest.raises(NotFound, match="Unable to find system shared memory region: 'r'"):
        registry.status("system", "r")


def test_off_by_default_and_no_cuda_here(key: str) -> None:
    registry = SharedMemoryRegistry(enabled=False)
    for call in (
        lambda: registry.register_system("r", key, 0, 4),
        lambda: registry.status("system", ""),
        lambda: registry.unregister("cuda", ""),
    ):
        with pytest.raises(InvalidArgument, match=DISABLED.split(";")[0]):
            call()
    enabled = SharedMemoryRegistry(enabled=True)
    assert not enabled.cuda_available
    with pytest.raises(Unsupported, match="CUDA shared memory is not available"):
        enabled.register_cuda("c", b"\0" * 64, 0, 8)
