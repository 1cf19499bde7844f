"""Region, through the registry: system regions are read and written through their
descriptor, never a mapping, so an object its owner truncates (even between the check and the
copy), grows, unlinks or replaces is a refusal or nothing at all, never a fault; reads are the
request's own copies, in the server's pool."""

from __future__ import annotations

import gc
import os
import threading
import time
from typing import Any

import numpy as np
import pytest

from server.errors import AlreadyExists, InvalidArgument
from server.memory.host_pool import PAGE, HostBufferPool
from server.memory.shared_memory import SharedMemoryRegistry


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
        lease.write(
            "r", 0, 16, "OUT",
            memoryview(np.int32([9, 9, 9, 9]).tobytes()),  # type: ignore[arg-type]
        )
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
