"""The gRPC connection against a fake transport: what it hands the socket to read into, how
it closes, how much it holds back while parsing, and what it gathers into one write."""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import os
import struct
from collections.abc import Iterator
from typing import cast

import hpack
import pytest

from server import event_loop
from server.grpc import frames, streams
from server.grpc.call import CallContext, Method, Views
from server.grpc.connection import GrpcService, Http2Connection
from server.memory.host_pool import BufferSource
from server.settings import GrpcKeepalive
from tests.server.grpc.fakes import FakeTransport, Pool


async def _echo(request: bytes, context: CallContext) -> bytes:
    return bytes(request)


class _Viewed:
    """A handler answering with ``Views`` of a buffer, counting releases."""

    def __init__(self) -> None:
        self.released = 0

    async def __call__(self, request: bytes, context: CallContext) -> Views:
        return Views([b"head:", memoryview(bytes(request))], self._release)

    def _release(self) -> None:
        self.released += 1


def _connection(
    pool: Pool | None = None, viewed: _Viewed | None = None
) -> tuple[Http2Connection, FakeTransport]:
    handlers = {"/t/echo": Method(_echo)}
    if viewed is not None:
        handlers["/t/viewed"] = Method(viewed)
        handlers["/t/viewed-gzip"] = Method(viewed, compression="low")
    # The fake pool has only ``acquire``, all the connection uses of a ``BufferSource``.
    service = GrpcService(handlers, GrpcKeepalive(), buffers=cast("BufferSource | None", pool))
    connection = Http2Connection(service, ("127.0.0.1", 1))
    transport = FakeTransport()
    connection.connection_made(transport)  # type: ignore[arg-type]
    return connection, transport


def _feed(connection: Http2Connection, data: bytes) -> None:
    while data:
        buffer = connection.get_buffer(-1)
        size = min(len(buffer), len(data))
        buffer[:size] = data[:size]
        connection.buffer_updated(size)
        data = data[size:]


def _start(stream: int, path: str = "/t/echo", *extra: tuple[str, str]) -> bytes:
    block = hpack.Encoder().encode(
        [(":method", "POST"), (":scheme", "http"), (":path", path), (":authority", "x"),
         ("content-type", "application/grpc"), *extra]
    )
    return frames.frame(frames.HEADERS, frames.END_HEADERS, stream, block)


def _frames(data: bytes) -> list[tuple[int, int, int, bytes]]:
    out, pos = [], 0
    while pos + 9 <= len(data):
        word, flags, stream = frames.HEADER.unpack_from(data, pos)
        length = word >> 8
        out.append((word & 0xFF, flags, stream, data[pos + 9 : pos + 9 + length]))
        pos += 9 + length
    return out


def test_a_buffer_handed_out_for_a_direct_read_but_not_filled_is_forgotten() -> None:
    """uvloop may ask for a buffer and read nothing into it. When the call whose message it
    was for has gone meanwhile (its deadline passed), the next read goes through the parser:
    the frame's tail is skipped and the frames after it are read."""

    async def main() -> None:
        pool = Pool()
        connection, transport = _connection(pool)
        message = b"\x00" + struct.pack(">I", 100_000) + b"p" * 100_000
        data_header = frames.header(frames.DATA, 0, 1, len(message))
        _feed(connection, frames.PREFACE + frames.settings({}) + _start(1) + data_header
              + message[:40_000])
        assert len(connection.get_buffer(-1)) == 60_005  # the rest goes straight into the pool
        # ...but nothing is read now; the call goes (its deadline, say)
        connection._streams[1]._expire()
        assert pool.given[0].released == 1
        before = len(transport.written)
        _feed(connection, message[40_000:] + frames.ping(b"12345678", ack=False))
        assert (frames.PING, frames.ACK, 0, b"12345678") in _frames(
            bytes(transport.written[before:])
        )
        assert not transport.closed
        connection.connection_lost(None)

    event_loop.run(main())


def test_closing_drops_a_connection_whose_client_reads_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(streams, "CLOSE_GRACE_S", 0.01)

    async def main() -> None:
        connection, transport = _connection()
        transport.buffered = 1 << 20  # written, and never taken by the client
        connection.close()
        assert transport.closed and not transport.aborted
        await asyncio.sleep(0.05)
        assert transport.aborted
        other, other_transport = _connection()
        other.close()
        await asyncio.sleep(0.05)
        assert other_transport.closed and not other_transport.aborted  # it had sent all
        aborted, aborted_transport = _connection()
        aborted.abort()  # (the server stopping)
        assert aborted_transport.aborted

    event_loop.run(main())


def test_a_keepalive_ping_unanswered_drops_the_connection() -> None:
    async def main() -> None:
        connection, transport = _connection()
        connection._keepalive_lost()
        assert transport.aborted

    event_loop.run(main())


def test_what_is_written_while_parsing_goes_out_past_a_bound() -> None:
    """Writes made while a read is parsed are held, up to a bound: a handler producing more
    in that step has the transport take it (and pause the streams when its buffer fills)."""

    async def main() -> None:
        connection, transport = _connection()
        start = len(transport.written)
        connection._batch = []
        connection._write(b"s" * 100)
        assert len(transport.written) == start
        connection._write(b"b" * streams._BATCH_BYTES)
        assert len(transport.written) == start + 100 + streams._BATCH_BYTES
        connection._write_batch()

    event_loop.run(main())


def _unary_call(stream: int, path: str, message: bytes) -> bytes:
    wire = b"\x00" + struct.pack(">I", len(message)) + message
    return _start(stream, path) + frames.frame(frames.DATA, frames.END_STREAM, stream, wire)


def test_views_are_released_once_the_transport_has_given_them_to_the_kernel() -> None:
    """A reply of ``Views`` is written from its parts; its release waits while the transport
    still holds bytes (it may hold references to the views), until ``resume_writing`` says
    its buffer is empty, or the connection is lost."""

    async def main() -> None:
        viewed = _Viewed()
        connection, transport = _connection(viewed=viewed)
        assert transport.high_water == 0  # so that it tells when its buffer empties
        _feed(connection, frames.PREFACE + frames.settings({}))
        transport.buffered = 1000  # the client is slow to take what it was sent
        _feed(connection, _unary_call(1, "/t/viewed", b"x" * 100))
        await asyncio.sleep(0.01)
        assert b"head:" + b"x" * 100 in transport.written
        assert viewed.released == 0
        transport.buffered = 0
        connection.resume_writing()
        assert viewed.released == 1
        transport.buffered = 1000
        _feed(connection, _unary_call(3, "/t/viewed", b"y" * 100))
        await asyncio.sleep(0.01)
        assert b"head:" + b"y" * 100 in transport.written
        assert viewed.released == 1
        connection.connection_lost(None)
        assert viewed.released == 2

    event_loop.run(main())


def test_views_are_compressed_from_their_parts_or_sent_as_they_are() -> None:
    """A compressed reply is made from the views' parts, which are released once it is;
    views that would not shrink go out uncompressed, from the views, released once sent."""

    async def main() -> None:
        viewed = _Viewed()
        connection, transport = _connection(viewed=viewed)
        _feed(connection, frames.PREFACE + frames.settings({}))
        transport.buffered = 1000
        for stream, message in ((1, b"z" * 4000), (3, os.urandom(4000))):
            wire = b"\x00" + struct.pack(">I", len(message)) + message
            _feed(connection, _start(stream, "/t/viewed-gzip", ("grpc-accept-encoding", "gzip"))
                  + frames.frame(frames.DATA, frames.END_STREAM, stream, wire))
            await asyncio.sleep(0.01)
        assert viewed.released == 1  # the compressed one; the other waits for the transport
        data = {f[2]: f[3] for f in _frames(bytes(transport.written)) if f[0] == frames.DATA}
        assert data[1][0] == 1 and gzip.decompress(data[1][5:]) == b"head:" + b"z" * 4000
        assert data[3][0] == 0 and data[3][5:9] == b"head"
        connection.connection_lost(None)
        assert viewed.released == 2

    event_loop.run(main())


def test_answers_resumed_in_one_pass_of_the_loop_go_out_in_one_write() -> None:
    """Calls answered when their results arrive together (a dynamic batch's) are written
    together at the end of that pass of the loop, not one write each."""

    async def main() -> None:
        results = asyncio.Event()

        async def answer_later(request: bytes, context: CallContext) -> bytes:
            await results.wait()
            return bytes(request)

        service = GrpcService({"/t/later": Method(answer_later)}, GrpcKeepalive())
        connection = Http2Connection(service, ("127.0.0.1", 1))
        transport = FakeTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        _feed(connection, frames.PREFACE + frames.settings({}) + b"".join(
            _unary_call(stream, "/t/later", b"m%d" % stream) for stream in (1, 3, 5)))
        await asyncio.sleep(0.01)  # every call waits for its result
        writes = transport.writes
        results.set()
        await asyncio.sleep(0.01)
        assert transport.writes == writes + 1
        answered = {f[2]: f[3][5:] for f in _frames(bytes(transport.written))
                    if f[0] == frames.DATA}
        assert answered == {1: b"m1", 3: b"m3", 5: b"m5"}
        connection.connection_lost(None)

    event_loop.run(main())


def test_the_requests_of_one_read_start_while_the_service_holds_them() -> None:
    """Every call parsed from one read starts inside one ``requests_held`` (a front end
    then sends them to the executor together); the next read is held afresh."""

    async def main() -> None:
        held: list[str] = []
        started: list[tuple[int, list[str]]] = []

        @contextlib.contextmanager
        def requests_held() -> Iterator[None]:
            held.append("hold")
            yield
            held.append("release")

        async def record(request: bytes, context: CallContext) -> bytes:
            started.append((int(request), list(held)))
            return request

        service = GrpcService({"/t/record": Method(record)}, GrpcKeepalive(),
                              requests_held=requests_held)
        connection = Http2Connection(service, ("127.0.0.1", 1))
        connection.connection_made(FakeTransport())  # type: ignore[arg-type]
        _feed(connection, frames.PREFACE + frames.settings({}))
        held.clear()
        _feed(connection, _unary_call(1, "/t/record", b"1") + _unary_call(3, "/t/record", b"3"))
        _feed(connection, _unary_call(5, "/t/record", b"5"))
        await asyncio.sleep(0.01)
        assert started == [(1, ["hold"]), (3, ["hold"]), (5, ["hold", "release", "hold"])]
        assert held == ["hold", "release", "hold", "release"]
        connection.connection_lost(None)

    event_loop.run(main())
