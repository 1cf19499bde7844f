"""A framed message channel over a connected AF_UNIX stream socket.

Frames are a 4-byte little-endian length and a msgpack body. Reads land in one preallocated
buffer (``BufferedProtocol``: no ``bytes`` per read).

When messages are written decides how the processes share the cores. Gathering every message
until the end of the loop's pass saved write calls, but made the two processes take turns (the
executor ran all 8 requests in flight before the front end saw the first answer, then the
front end wrote all 8 before the executor saw new work): one front end with the executor
served 1,844-2,070/s against 2,330-2,820/s writing at once. One read is the unit instead:
what is sent while the messages of one read are handled, or while a front end parses one
read of a gRPC client (``hold``), goes out in one write when that read is done. A channel
made with ``gather`` (the executor's) holds each of its reads, so the answers of the
requests it answered inline as it read them are one write, and also gathers what tasks send
in one pass of the loop: the answers of one dynamic batch resume together. A front end holds
the parsing of each gRPC read (``Plane.requests_held``), so requests that arrived together
reach the batcher together. Measured under perf_analyzer with 2 front ends: for mlp over gRPC
at c=32, holding the front end's gRPC reads cut its writes to the executor from 1.0 to 0.3
per request and grew the mean batch from 5 to 7; for simple over gRPC at c=8, holding the
executor's reads served 5,853/s against 5,468/s (medians of 5), HTTP unchanged.

The first message of a connection travels with an fd (``SCM_RIGHTS``), exchanged before the
channel takes the socket over.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import struct
from collections.abc import Callable
from typing import Any, Generic, TypeVar, cast

import msgspec

log = logging.getLogger("server.ipc")

Message = TypeVar("Message")
_LENGTH = struct.Struct("<I")
_INITIAL_BUFFER = 1 << 20
#: Frames larger than this are a bug of the peer: the connection is dropped.
MAX_FRAME = 1 << 31
_HANDSHAKE_BYTES = 4096


def send_hello(sock: socket.socket, body: bytes, fd: int) -> None:
    """The first message, with ``fd`` attached (a blocking socket, or one with room: the
    first message is a few bytes on a new connection)."""
    socket.send_fds(sock, [_LENGTH.pack(len(body)) + body], [fd])


def receive_hello(sock: socket.socket) -> tuple[bytes, int]:
    """The first message and the fd that came with it (a blocking socket with a timeout, or
    one ``wait_readable`` has waited for: the message is sent in one call)."""
    data, fds, _flags, _address = socket.recv_fds(sock, _HANDSHAKE_BYTES, 1)
    if len(data) < _LENGTH.size or not fds:
        for fd in fds:
            socket.close(fd)
        raise ConnectionError("the peer did not introduce itself")
    (length,) = _LENGTH.unpack_from(data)
    if length != len(data) - _LENGTH.size:
        socket.close(fds[0])
        raise ConnectionError("malformed introduction")
    return data[_LENGTH.size :], fds[0]


async def wait_readable(sock: socket.socket) -> None:
    """Until ``sock`` (non-blocking) has something to read, or its end, waiting on the loop."""
    loop = asyncio.get_running_loop()
    readable: asyncio.Future[None] = loop.create_future()

    def wake() -> None:
        if not readable.done():
            readable.set_result(None)

    loop.add_reader(sock.fileno(), wake)
    try:
        await readable
    finally:
        loop.remove_reader(sock.fileno())


class Channel(asyncio.BufferedProtocol, Generic[Message]):
    """Delivers each decoded message to ``on_message``; ``on_lost`` once, when the connection
    ends (peer gone, or an undecodable frame)."""

    def __init__(
        self,
        decoder: msgspec.msgpack.Decoder[Message],
        on_message: Callable[[Message], None],
        on_lost: Callable[[], None],
        gather: bool = False,
    ) -> None:
        """``gather``: what is sent while one read is handled is written together at its
        end, and what tasks send together at the end of the loop's pass (the executor's
        channel; the module docstring says why)."""
        self._decoder = decoder
        self._gather = gather
        self._on_message = on_message
        self._on_lost = on_lost
        self._encoder = msgspec.msgpack.Encoder()
        self._buffer = bytearray(_INITIAL_BUFFER)
        self._view = memoryview(self._buffer)
        self._filled = 0
        self._transport: asyncio.Transport | None = None
        self._queued: list[bytes] = []  # sent before the transport existed
        self._gathered: list[bytes] = []  # frames held (by tasks this pass, or a hold)
        self._holds = 0  # open ``hold`` calls: what is sent is gathered until the last ends
        self.loop = asyncio.get_running_loop()
        self.closed = False

    async def attach(self, sock: socket.socket) -> None:
        """Start reading and writing on ``sock``. The owner holds the channel before this:
        a message that arrives at once can be answered through it, and what is sent before
        the transport exists waits for it."""
        sock.setblocking(False)
        await self.loop.connect_accepted_socket(lambda: self, sock)

    # --- writing --------------------------------------------------------------------------

    def send(self, message: Any) -> None:
        """Write ``message`` now, or at the end of this loop pass if gathering (before the
        channel is attached: once it is). Messages go out in the order they were sent."""
        if self.closed:
            return
        body = self._encoder.encode(message)
        if self._transport is None:
            self._queued.append(_LENGTH.pack(len(body)))
            self._queued.append(body)
            return
        frame = _LENGTH.pack(len(body)) + body
        if self._gathered or self._holds:
            self._gathered.append(frame)
        elif self._gather and asyncio.current_task(self.loop) is not None:
            self._gathered.append(frame)
            self.loop.call_soon(self._flush)
        else:
            self._transport.write(frame)

    def hold(self) -> None:
        """Gather what is sent from now until the matching ``release``."""
        self._holds += 1

    def release(self) -> None:
        """End a ``hold``; the last one writes what was gathered, in one write."""
        self._holds -= 1
        if not self._holds:
            self._flush()

    def _flush(self) -> None:
        gathered, self._gathered = self._gathered, []
        if gathered and self._transport is not None and not self.closed:
            self._transport.write(b"".join(gathered))

    def close(self) -> None:
        if self._transport is not None:
            self._flush()
            self._transport.close()

    # --- reading --------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, but are ones.
        self._transport = cast(asyncio.Transport, transport)
        if self._queued:
            self._transport.write(b"".join(self._queued))
            self._queued.clear()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._filled == len(self._buffer):
            self._grow(len(self._buffer) * 2)
        return self._view[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        start = 0
        view = self._view
        if self._gather:
            self.hold()
        try:
            while self._filled - start >= _LENGTH.size:
                (length,) = _LENGTH.unpack_from(view, start)
                end = start + _LENGTH.size + length
                if end > self._filled:  # the rest of this frame is still to come
                    if length > MAX_FRAME:
                        raise ValueError(f"frame of {length} bytes")
                    needed = _LENGTH.size + length
                    if needed > len(self._buffer):
                        self._compact(start)
                        start = 0
                        self._grow(needed)
                    break
                message = self._decoder.decode(view[start + _LENGTH.size : end])
                start = end
                self._on_message(message)
        except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as exc:
            log.error("dropping a connection that sent an undecodable message: %s", exc)
            self.closed = True
            if self._transport is not None:
                self._transport.close()
            return
        finally:
            if self._gather:
                self.release()
        self._compact(start)

    def _compact(self, start: int) -> None:
        if start == 0:
            return
        remaining = self._filled - start
        if remaining:
            self._view[:remaining] = self._view[start : self._filled]
        self._filled = remaining

    def _grow(self, size: int) -> None:
        bigger = bytearray(max(size, len(self._buffer)))
        bigger[: self._filled] = self._view[: self._filled]
        self._view.release()
        self._buffer = bigger
        self._view = memoryview(bigger)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._queued.clear()
        self._gathered.clear()
        self._on_lost()
