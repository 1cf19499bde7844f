"""SharedMemoryRegistry with real POSIX shared memory: registration checks, bounds, leases
that keep a region open through unregistration, status, the off switch, and objects their
owner truncates, grows, unlinks or replaces."""

from __future__ import annotations

import gc
import os
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from server.errors import AlreadyExists, InvalidArgument, NotFound, Unavailable, Unsupported
from server.memory import shared_memory
from server.memory.host_pool import PAGE, HostBufferPool
from server.memory.shared_memory import DISABLED, SharedMemoryRegistry


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


# --- regions are read and written through their descriptor, never a mapping -----------------


def _path(key: str) -> str:
    return f"/dev/shm/{key[1:]}"


def _descriptors_of(key: str) -> int:
    """How many of this process's descriptors are open on ``key``'s object."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}") == _path(key)
        except FileNotFoundError:  # closed meanwhile (the listing's own descriptor)
            pass
    return count


@pytest.mark.parametrize("size", [0, 100, 191])
def test_a_truncated_object_is_refused_at_use(key: str, size: int) -> None:
    """Truncated below the region's end (offset 64 + 128 bytes): reads and writes of any part
    of the region are refused, naming region and tensor, never the key."""
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("r", key, 64, 128)
    os.truncate(_path(key), size)
    with registry.lease({"r"}) as lease:
        for call, tensor in (
            (lambda: lease.read("r", 0, 8, "IN"), "IN"),
            (lambda: lease.write("r", 0, 8, "OUT", memoryview(bytes(8))), "OUT"),
        ):
            with pytest.raises(InvalidArgument) as info:
                call()
            message = str(info.value)
            assert message == (
                f"shared memory region 'r' for tensor '{tensor}' is smaller than registered: "
                f"its shared memory object now has {size} bytes, the region ends at byte 192"
            )
    assert os.stat(_path(key)).st_size == size, "a refused write does not grow the object"
    os.truncate(_path(key), 4096)  # given its size back, the region works again
    with registry.lease({"r"}) as lease, open(_path(key), "rb") as handle:
        assert bytes(lease.read("r", 0, 128, "IN")) == handle.read()[64:192]
    registry.close()


def test_truncation_between_the_check_and_the_read_is_refused(
    key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The object passes the size check, then is cut before the bytes are read: the short
    read is the same refusal, not a fault."""
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("r", key, 0, 4096)
    real_fstat = os.fstat

    def fstat_then_truncate(fd: int) -> os.stat_result:
        info = real_fstat(fd)
        os.truncate(_path(key), 1000)
        return info

    monkeypatch.setattr(os, "fstat", fstat_then_truncate)
    with registry.lease({"r"}) as lease, pytest.raises(InvalidArgument) as info:
        lease.read("r", 0, 4096, "IN")
    assert str(info.value) == (
        "shared memory region 'r' for tensor 'IN' is smaller than registered: it was "
        "truncated while being read"
    )
    monkeypatch.setattr(os, "fstat", real_fstat)
    os.truncate(_path(key), 4096)
    with registry.lease({"r"}) as lease:  # the registry is intact
        np.testing.assert_array_equal(np.frombuffer(lease.read("r", 0, 8, "IN"), np.int32), [0, 1])
    registry.close()


def test_inputs_are_copies_of_the_region(key: str) -> None:
    """What a request reads is its own: the client (or an output written into the region)
    changing the object afterwards does not change it."""
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("r", key, 0, 64)
    with registry.lease({"r"}) as lease:
        data = np.frombuffer(lease.read("r", 0, 16, "IN"), np.int32)
        lease.write("r", 0, 16, "OUT", memoryview(np.int32([9, 9, 9, 9]).tobytes()))
        np.testing.assert_array_equal(data, [0, 1, 2, 3])
        np.testing.assert_array_equal(
            np.frombuffer(lease.read("r", 0, 16, "IN"), np.int32), [9, 9, 9, 9]
        )
    registry.close()


def test_reads_go_into_the_servers_pool(key: str) -> None:
    """With the server's pool (pinned with a GPU) inputs are copied into its buffers, which go
    back when the tensor's last view does; without one, into page-aligned memory."""
    pool = HostBufferPool()
    registry = SharedMemoryRegistry(enabled=True, pool=pool)
    registry.register_system("r", key, 0, 4096)
    with registry.lease({"r"}) as lease:
        data = np.frombuffer(lease.read("r", 0, 4096, "IN"), np.int32)
    np.testing.assert_array_equal(data, np.arange(1024))
    assert data.ctypes.data % PAGE == 0 and pool.bytes_in_use > 0
    del data
    gc.collect()
    assert pool.bytes_in_use == 0
    plain = SharedMemoryRegistry(enabled=True)
    plain.register_system("r", key, 0, 4096)
    with plain.lease({"r"}) as lease:
        assert np.frombuffer(lease.read("r", 0, 4096, "IN"), np.uint8).ctypes.data % PAGE == 0
    registry.close()
    plain.close()


def test_partial_transfers_are_continued(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel may move fewer bytes than asked (at most about 2 GiB a call): reads and
    writes go on until every byte has moved."""
    real_preadv, real_pwritev = os.preadv, os.pwritev
    calls: list[int] = []

    def in_pieces(real: Any) -> Any:
        def call(fd: int, buffers: list[memoryview], position: int) -> int:
            calls.append(position)
            return int(real(fd, [buffers[0][:100]], position))

        return call

    monkeypatch.setattr(os, "preadv", in_pieces(real_preadv))
    monkeypatch.setattr(os, "pwritev", in_pieces(real_pwritev))
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("r", key, 4, 1000)
    with registry.lease({"r"}) as lease:
        got = np.frombuffer(lease.read("r", 0, 256, "IN"), np.int32)
        np.testing.assert_array_equal(got, np.arange(1, 65))
        assert calls == [4, 104, 204]
        lease.write("r", 4, 300, "OUT", memoryview(bytes(range(256)) + bytes(44)))
    with open(_path(key), "rb") as handle:
        assert handle.read()[8:308] == bytes(range(256)) + bytes(44)
    registry.close()


def test_failed_writes_are_refusals(key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("r", key, 0, 64)

    def no_space(fd: int, buffers: list[memoryview], position: int) -> int:
        raise OSError(28, "No space left on device", _path(key))

    def stuck(fd: int, buffers: list[memoryview], position: int) -> int:
        return 0

    with registry.lease({"r"}) as lease:
        monkeypatch.setattr(os, "pwritev", no_space)
        with pytest.raises(InvalidArgument) as info:
            lease.write("r", 0, 8, "OUT", memoryview(bytes(8)))
        assert str(info.value) == (
            "shared memory region 'r' for tensor 'OUT' cannot be accessed: "
            "No space left on device"
        )
        monkeypatch.setattr(os, "pwritev", stuck)
        with pytest.raises(InvalidArgument, match="the write stopped short"):
            lease.write("r", 0, 8, "OUT", memoryview(bytes(8)))
    registry.close()


@pytest.mark.parametrize("action", ["grow", "unlink", "replace"])
def test_what_the_owner_does_to_its_object_cannot_fault(key: str, action: str) -> None:
    """The region is the object opened at registration: grown, it still reads; unlinked or
    replaced under the same key, the old object is still read and written (nothing the client
    sees) until the client registers again."""
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("r", key, 0, 64)
    if action == "grow":
        os.truncate(_path(key), 1 << 20)
    else:
        os.unlink(_path(key))
        if action == "replace":
            with open(_path(key), "wb") as handle:
                handle.write(b"\xff" * 4096)
    with registry.lease({"r"}) as lease:
        np.testing.assert_array_equal(np.frombuffer(lease.read("r", 0, 8, "IN"), np.int32), [0, 1])
        lease.write("r", 0, 4, "OUT", memoryview(bytes(4)))
    registry.close()
    if action == "unlink":  # the fixture removes it
        open(_path(key), "wb").close()


def test_truncation_racing_with_use_never_faults(key: str) -> None:
    """The owner cuts and restores its object as fast as it can while a request reads and
    writes it: each use succeeds or is refused, and this process survives (a mapping would
    fault here and kill it)."""
    registry = SharedMemoryRegistry(enabled=True)
    registry.register_system("r", key, 0, 4096)
    stop = threading.Event()

    def owner() -> None:
        while not stop.is_set():
            os.truncate(_path(key), 0)
            os.truncate(_path(key), 4096)

    thread = threading.Thread(target=owner)
    thread.start()
    outcomes: set[str] = set()
    uses = 0
    deadline = time.monotonic() + 10
    try:
        with registry.lease({"r"}) as lease:
            # At least 1000 uses, and on until both outcomes have been seen (or 10 s).
            while uses < 1000 or (len(outcomes) < 2 and time.monotonic() < deadline):
                uses += 1
                try:
                    assert lease.read("r", 0, 4096, "IN").nbytes == 4096
                    lease.write("r", 0, 4096, "OUT", memoryview(bytes(4096)))
                    outcomes.add("used")
                except InvalidArgument as error:
                    assert "is smaller than registered" in str(error)
                    outcomes.add("refused")
    finally:
        stop.set()
        thread.join()
    assert outcomes == {"used", "refused"}
    registry.close()


def test_descriptors_are_closed_with_their_region(key: str) -> None:
    """One descriptor per region, kept while a request holds it after unregistration and
    closed when it is done; a refused registration keeps none."""
    registry = SharedMemoryRegistry(enabled=True)
    with pytest.raises(InvalidArgument):
        registry.register_system("big", key, 0, 8192)
    assert _descriptors_of(key) == 0
    registry.register_system("r", key, 0, 64)
    with pytest.raises(AlreadyExists):
        registry.register_system("r", key, 0, 64)
    assert _descriptors_of(key) == 1
    with registry.lease({"r"}) as lease:
        registry.unregister("system", "r")
        assert _descriptors_of(key) == 1
        lease.read("r", 0, 8, "IN")
    assert _descriptors_of(key) == 0
