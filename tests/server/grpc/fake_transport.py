"""A transport that keeps what a connection writes, for driving ``server.grpc.connection``
without a socket."""

from __future__ import annotations


class FakeTransport:
    """What the connection wrote, whether it closed (gracefully or at once), and a write
    buffer size to report (``buffered``: bytes the client has not taken)."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closed = False
        self.aborted = False
        self.buffered = 0

    def write(self, data: bytes | memoryview) -> None:
        self.written += data

    def writelines(self, parts: list[bytes | memoryview]) -> None:
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
