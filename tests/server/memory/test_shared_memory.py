"""SharedMemoryRegistry with real POSIX shared memory: registration checks, bounds, leases
that keep a region open through unregistration, status, and the off switch."""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import numpy as np
import pytest

from server.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable, Unsupported
from server.memory import shared_memory
from server.memory.shared_memory import DISABLED, SharedMemoryRegistry


def test_register_read_write_status(key: str) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("r", key, 64, 256)
    assert registry.status("system", "") == [
        {"name": "r", "key": key, "offset": 64, "byte_size": 256}
    ]
    with registry.lease({"r"}) as lease:
        view = lease.read("r", 16, 8, "IN")
        np.testing.assert_array_equal(np.frombuffer(view, np.int32), [20, 21])
        lease.write(
            "r", 0, 8, "OUT",
            memoryview(np.int32([-1, -2]).tobytes()),  # type: ignore[arg-type]
        )
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


def test_symbolic_links_and_other_files_are_refused(key: str, tmp_path: Path) -> None:
    """A key is opened as shm_open does (no link followed): a link under /dev/shm must not
    reach a file elsewhere, and a key must name a regular file."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"TOPSECRET" * 10)
    link = f"tg_link_{uuid.uuid4().hex}"
    os.symlink(secret, f"/dev/shm/{link}")
    folder = f"tg_dir_{uuid.uuid4().hex}"
    os.mkdir(f"/dev/shm/{folder}")
    try:
        registry = SharedMemoryRegistry(enabled=True)
        for bad in ("/" + link, "/" + folder):
            with pytest.raises(InvalidArgument, match="invalid args"):
                registry.register_system("r", bad, 0, 8)
        assert registry.status("system", "") == []
    finally:
        os.unlink(f"/dev/shm/{link}")
        os.rmdir(f"/dev/shm/{folder}")


def test_reserved_prefix_with_a_slash_and_offsets_at_the_end(key: str) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    with pytest.raises(InvalidArgument, match="reserved prefix"):
        registry.register_system("p", "/triton_python_backend_shm_region_1", 0, 16)
    registry.register_system("r", key, 0, 64)
    with registry.lease({"r"}) as lease:
        with pytest.raises(InvalidArgument, match="Invalid offset for shared memory region"):
            lease.read("r", 64, 0, "IN")
        assert lease.read("r", 0, 0, "IN").nbytes == 0
    registry.close()


def test_the_number_of_regions_is_bounded(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_memory, "MAX_REGIONS", 3)
    registry = SharedMemoryRegistry(enabled=True)
    for index in range(3):
        registry.register_system(f"r{index}", key, 0, 16)
    with pytest.raises(Unavailable, match="3 regions are registered already"):
        registry.register_system("r3", key, 0, 16)
    registry.unregister("system", "r0")
    registry.register_system("r3", key, 0, 16)
    registry.close()

