"""Test doubles for ``server.grpc.connection``: a transport that keeps what a connection
writes (driving it without a socket), and a buffer pool that records what it handed out."""

from __future__ import annotations

from server.errors import Unavailable


class FakeTransport:
    """What the connection wrote, whether it closed (gracefully or at once), and a write
    buffer size to report (``buffered``: bytes the client has not taken)."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.buffered = 0
        self.writes = 0  # calls of write and writelines

    def write(self, data: bytes | memoryview) -> None:
        self.writes += 1
        self.written += data

    def writelines(self, parts: list[bytes | memoryview]) -> None:
        self.writes += 1
        for part in parts:
            self.written += part

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = self.aborted = True

    def is_closing(self) -> bool:
        return self.closed

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        self.high_water = high


class Buffer:
    """A pooled buffer that counts its releases."""

    pinned = False

    def __init__(self, nbytes: int) -> None:
        self.view = memoryview(bytearray(nbytes))
        self.released = 0

    def release(self) -> None:
        self.released += 1


class Pool:
    """A buffer source recording what it handed out; ``full`` refuses as a full arena does."""

    def __init__(self) -> None:
        self.given: list[Buffer] = []
        self.full = False

    def acquire(self, nbytes: int) -> Buffer:
        if self.full:
            raise Unavailable("the server is busy: no free block")
        self.given.append(Buffer(nbytes))
        return self.given[-1]
