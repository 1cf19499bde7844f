"""The gRPC port's HTTP/2 (``server.grpc.connection``) seen frame by frame from a raw client
(``tests.server.grpc.raw_http2``), with test handlers: framing, flow control both ways, the
stream limit, refusals, deadlines and cancellation, going away."""

from __future__ import annotations

import asyncio
import gzip
import socket
import threading
import time
import zlib
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import grpc
import h2.config
import pytest
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from tornado.netutil import bind_sockets

from server import event_loop
from server.errors import Unavailable
from server.grpc import connection as grpc_connection
from server.grpc.call import REFUSAL_DELAY_S, CallContext, Method
from server.grpc.connection import CONNECTION_WINDOW, MAX_FRAME_SIZE, STREAM_WINDOW, GrpcService
from server.grpc.status import StatusCode
from server.listener import Listener
from server.settings import GrpcKeepalive
from tests.server.grpc.fakes import Buffer, Pool
from tests.server.grpc.raw_http2 import RawHttp2Client, call_headers, grpc_message


class Handlers:
    """Test methods, and what happened to them (touched from the server's thread)."""

    def __init__(self) -> None:
        self.release = asyncio.Event()  # created in the server's loop (see Server)
        self.started = 0
        self.cancelled = 0
        self.read: list[bytes] = []
        self.buffers: list[Any] = []  # each call's context.request_buffer
        self.cleaned_up = 0  # ``ticks`` streams that ran their clean-up
        self.left: list[float | None] = []  # each cancelled ``block`` call's time remaining

    async def echo(self, request: bytes, context: CallContext) -> bytes:
        self.buffers.append(context.request_buffer)
        return bytes(request)

    async def block(self, request: bytes, context: CallContext) -> bytes:
        """Waits for ``release``; a cancellation ends it only once released too (as a request
        the executor still runs waits for its answer)."""
        self.started += 1
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.left.append(context.time_remaining())
            self.cancelled += 1
            await asyncio.shield(self.release.wait())
            raise
        return request

    async def fail(self, request: bytes, context: CallContext) -> bytes:
        raise RuntimeError("boom")

    async def abort(self, request: bytes, context: CallContext) -> bytes:
        await context.abort(StatusCode.NOT_FOUND, "no model 'ü' 100%")
        return b""

    async def long_abort(self, request: bytes, context: CallContext) -> bytes:
        await context.abort(StatusCode.INVALID_ARGUMENT, "ü" * 10_000)
        return b""

    async def ticks(self, request: bytes, context: CallContext) -> AsyncIterator[bytes]:
        """A reply every 10 ms until the client goes; then its clean-up."""
        try:
            while True:
                yield b"tick"
                await asyncio.sleep(0.01)
        finally:
            self.cleaned_up += 1

    async def chunks(self, request: bytes, context: CallContext) -> AsyncIterator[bytes]:
        """The request three times over, one reply each."""
        for _ in range(3):
            yield bytes(request)

    async def remaining(self, request: bytes, context: CallContext) -> bytes:
        """"ok" when the time remaining is the client's timeout less a moment, "none" when
        the call has no deadline, else the time remaining."""
        left = context.time_remaining()
        if left is None:
            return b"none"
        return b"ok" if 2.5 < left <= 3.0 else str(left).encode()

    async def metadata(self, request: bytes, context: CallContext) -> bytes:
        return repr(sorted(context.invocation_metadata())).encode()

    async def stream(self, requests: AsyncIterator[bytes], context: CallContext) -> AsyncIterator[bytes]:
        """Replies to each request with itself; reads nothing until ``release``."""
        await self.release.wait()
        async for request in requests:
            self.read.append(request)
            yield request

    async def own_stream(
        self, requests: AsyncIterator[Any], context: CallContext
    ) -> AsyncIterator[bytes]:
        """Replies to each request with itself; a pooled one is recorded and released, as
        the servicer does once its request is answered."""
        async for request in requests:
            if isinstance(request, bytes | bytearray):
                yield bytes(request)
            else:
                self.buffers.append(request)
                reply = bytes(request.view)
                request.release()
                yield reply

    def methods(self) -> dict[str, Method]:
        unary = ("echo", "block", "fail", "abort", "long_abort", "metadata", "remaining")
        table = {f"/t/{name}": Method(getattr(self, name)) for name in unary}
        table["/t/ticks"] = Method(self.ticks, response_streaming=True)
        table["/t/stream"] = Method(self.stream, request_streaming=True, response_streaming=True)
        table["/t/own_stream"] = Method(
            self.own_stream, request_streaming=True, response_streaming=True
        )
        table["/t/refused"] = Method(self.echo, category="secret")
        table["/t/compressed"] = Method(self.echo, compression="low")
        table["/t/compressed_chunks"] = Method(
            self.chunks, response_streaming=True, compression="high"
        )
        return table


class Server:
    """A ``GrpcService`` on its own loop in a thread (the loop the server runs on: uvloop's
    where it is installed), on a free port of 127.0.0.1."""

    def __init__(
        self, keepalive: GrpcKeepalive, max_message_size: int, buffers: Any = None
    ) -> None:
        self.loop = (event_loop.loop_factory() or asyncio.new_event_loop)()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self.handlers = self.run(self._handlers())
        refusal = _refuse_secret
        self.service = GrpcService(
            self.handlers.methods(), keepalive, refusal, max_message_size, buffers
        )
        sockets = bind_sockets(0, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        self.listener = self.run(self._listen(sockets))

    async def _handlers(self) -> Handlers:
        return Handlers()

    async def _listen(self, sockets: list[socket.socket]) -> Listener:
        return Listener(self.service, sockets, "test")

    def run(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(10)

    def call_soon(self, function: Any, *args: Any) -> None:
        self.loop.call_soon_threadsafe(function, *args)

    def close(self) -> None:
        async def stop() -> None:
            self.listener.close()
            for connection in list(self.service.connections):
                connection.abort()
            await asyncio.sleep(0.05)

        self.run(stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


def _refuse_secret(method: Method, head: Any) -> Any:

    return Unavailable("restricted") if method.category == "secret" else None


@contextmanager
def serving(
    keepalive: GrpcKeepalive | None = None, max_message_size: int = 1 << 30, buffers: Any = None
) -> Iterator[Server]:
    server = Server(keepalive or GrpcKeepalive(), max_message_size, buffers)
    try:
        yield server
    finally:
        server.close()


@contextmanager
def client(server: Server, config: h2.config.H2Configuration | None = None) -> Iterator[RawHttp2Client]:
    raw = RawHttp2Client(server.port, config)
    try:
        raw.wait(lambda: bool(raw.settings))
        yield raw
    finally:
        raw.close()


def _send_in_frames(raw: RawHttp2Client, path: str, wire: bytes, frame_size: int) -> int:
    """A call to ``path`` whose request bytes go in DATA frames of ``frame_size``: its stream."""
    stream = raw.start(path)
    for start in range(0, len(wire), frame_size):
        raw.h2.send_data(stream, wire[start : start + frame_size])
        raw.flush()
    raw.h2.end_stream(stream)
    raw.flush()
    return stream


def _still_served(server: Server) -> None:
    """A good call on a fresh connection is answered."""
    with client(server) as fresh:
        assert fresh.call("/t/echo", b"good").messages() == [b"good"]


def test_the_server_announces_its_settings_and_window() -> None:
    with serving() as server, client(server) as raw:
        assert raw.settings[SettingCodes.MAX_CONCURRENT_STREAMS] == 1000
        assert raw.settings[SettingCodes.INITIAL_WINDOW_SIZE] == STREAM_WINDOW
        assert raw.settings[SettingCodes.MAX_FRAME_SIZE] == MAX_FRAME_SIZE
        raw.wait(lambda: raw.h2.outbound_flow_control_window == CONNECTION_WINDOW)
        assert raw.h2.outbound_flow_control_window == CONNECTION_WINDOW


def test_a_unary_call_is_answered_with_headers_message_and_trailers() -> None:
    with serving() as server, client(server) as raw:
        response = raw.call("/t/echo", b"hello")
        assert response.headers[":status"] == "200"
        assert response.headers["content-type"] == "application/grpc"
        assert response.messages() == [b"hello"]
        assert (response.status, response.message) == (0, "")


@pytest.mark.parametrize("frame_size", [1, 3, 7, 1000])
def test_a_message_in_many_frames_and_reads_is_put_together(frame_size: int) -> None:
    payload = bytes(range(256)) * 40
    wire = grpc_message(payload)
    with serving() as server, client(server) as raw:
        stream = raw.start("/t/echo")
        for start in range(0, len(wire), frame_size):
            raw.h2.send_data(stream, wire[start : start + frame_size])
            raw.send_raw(raw.h2.data_to_send())  # each frame in a write of its own
        raw.h2.end_stream(stream)
        raw.flush()
        assert raw.finish(stream).messages() == [payload]


def test_bytes_arriving_one_by_one_are_parsed() -> None:
    with serving() as server, client(server) as raw:
        stream = raw.start("/t/echo")
        raw.h2.send_data(stream, grpc_message(b"x" * 100), end_stream=True)
        for byte in raw.h2.data_to_send():
            raw.send_raw(bytes([byte]))
        assert raw.finish(stream).messages() == [b"x" * 100]


def test_metadata_reaches_the_handler_binary_values_decoded() -> None:
    with serving() as server, client(server) as raw:
        response = raw.call("/t/metadata", b"", ("x-key", "v"), ("x-data-bin", "AAEC"))
        assert response.messages() == [
            repr(sorted([("x-key", "v"), ("x-data-bin", b"\x00\x01\x02")])).encode()
        ]


def test_gzip_compressed_messages_are_decompressed() -> None:
    with serving() as server, client(server) as raw:
        stream = raw.start("/t/echo", ("grpc-encoding", "gzip"))
        raw.h2.send_data(stream, grpc_message(gzip.compress(b"abc" * 100), True), end_stream=True)
        raw.flush()
        assert raw.finish(stream).messages() == [b"abc" * 100]


def _flags_and_messages(data: bytes | bytearray) -> list[tuple[int, bytes]]:
    out, pos = [], 0
    while pos + 5 <= len(data):
        length = int.from_bytes(data[pos + 1 : pos + 5], "big")
        out.append((data[pos], bytes(data[pos + 5 : pos + 5 + length])))
        pos += 5 + length
    return out


def test_responses_are_compressed_with_what_the_level_picks_from_the_accepted() -> None:
    payload = b"compress me " * 100
    with serving() as server, client(server) as raw:
        response = raw.call("/t/compressed", payload, ("grpc-accept-encoding", "identity,deflate,gzip"))
        assert response.headers["grpc-encoding"] == "gzip"  # low: the first of gzip, deflate
        [(flag, message)] = _flags_and_messages(response.data)
        assert flag == 1 and gzip.decompress(message) == payload
        assert response.status == StatusCode.OK
        # A client that accepts neither gets the message as it is.
        response = raw.call("/t/compressed", payload)
        assert "grpc-encoding" not in response.headers
        assert _flags_and_messages(response.data) == [(0, payload)]
        # Nor is a method without a level compressed.
        response = raw.call("/t/echo", payload, ("grpc-accept-encoding", "gzip"))
        assert _flags_and_messages(response.data) == [(0, payload)]


def test_a_response_that_does_not_shrink_goes_uncompressed_under_the_calls_encoding() -> None:
    with serving() as server, client(server) as raw:
        response = raw.call("/t/compressed", b"abc", ("grpc-accept-encoding", "gzip"))
        assert response.headers["grpc-encoding"] == "gzip"
        assert _flags_and_messages(response.data) == [(0, b"abc")]


def test_streamed_responses_are_compressed_each() -> None:
    with serving() as server, client(server) as raw:
        response = raw.call(
            "/t/compressed_chunks", b"x" * 1000, ("grpc-accept-encoding", "gzip, deflate")
        )
        assert response.status == StatusCode.OK
        assert response.headers["grpc-encoding"] == "deflate"  # high: the last accepted
        replies = _flags_and_messages(response.data)
        assert len(replies) == 3
        for flag, message in replies:
            assert flag == 1 and zlib.decompress(message) == b"x" * 1000


@pytest.mark.parametrize(
    "encoding, payload, code, message",
    [
        ("gzip", gzip.compress(b"abc" * 100)[:-9], StatusCode.INTERNAL,
         "cannot decompress the message: cut short"),
        ("gzip", b"not gzip", StatusCode.INTERNAL,
         "cannot decompress the message: not gzip or deflate data"),
        ("snappy", b"x", StatusCode.INTERNAL, "a compressed message with grpc-encoding 'snappy'"),
        ("gzip", gzip.compress(b"z" * 1000), StatusCode.RESOURCE_EXHAUSTED,
         "Received message larger than max (more than 500 bytes once decompressed)"),
    ],
    ids=["truncated", "not-gzip", "unknown-encoding", "past-the-limit"],  # (gzip stamps the time)
)
def test_a_compressed_message_that_does_not_inflate_is_refused(
    encoding: str, payload: bytes, code: StatusCode, message: str
) -> None:
    with serving(max_message_size=500) as server, client(server) as raw:
        stream = raw.start("/t/echo", ("grpc-encoding", encoding))
        raw.h2.send_data(stream, grpc_message(payload, True), end_stream=True)
        raw.flush()
        response = raw.finish(stream)
        assert (response.status, response.message) == (code, message)
        assert raw.call("/t/echo", b"after").messages() == [b"after"]


@pytest.mark.parametrize(
    "path, code, message",
    [
        ("/t/nothing", StatusCode.UNIMPLEMENTED, "Method not found!"),
        ("/t/fail", StatusCode.UNKNOWN, "Unexpected <class 'RuntimeError'>: boom"),
        ("/t/abort", StatusCode.NOT_FOUND, "no model '%C3%BC' 100%25"),
        ("/t/refused", StatusCode.UNAVAILABLE, "restricted"),
    ],
)
def test_failed_calls_end_with_their_status(path: str, code: StatusCode, message: str) -> None:
    with serving() as server, client(server) as raw:
        response = raw.call(path, b"x")
        assert (response.status, response.message) == (code, message)
        assert raw.call("/t/echo", b"after").messages() == [b"after"]


def test_a_refused_stream_is_answered_without_a_message_too() -> None:
    with serving() as server, client(server) as raw:
        stream = raw.start("/t/refused")
        response = raw.finish(stream, 10 * REFUSAL_DELAY_S)
        assert response.status == StatusCode.UNAVAILABLE
        assert raw.call("/t/echo", b"after").messages() == [b"after"]


def test_a_message_over_the_limit_is_refused() -> None:
    with serving(max_message_size=100) as server, client(server) as raw:
        response = raw.call("/t/echo", b"x" * 101)
        assert response.status == StatusCode.RESOURCE_EXHAUSTED
        assert response.message == "Received message larger than max (101 vs. 100)"
        assert raw.call("/t/echo", b"x" * 100).messages() == [b"x" * 100]


@pytest.mark.parametrize(
    "headers, status",
    [
        ([(":method", "GET")], "405"),
        ([("content-type", "text/plain")], "415"),
    ],
)
def test_requests_that_are_not_grpc_get_an_http_status(
    headers: list[tuple[str, str]], status: str
) -> None:
    with serving() as server, client(server) as raw:
        stream = raw.h2.get_next_available_stream_id()
        base = {":method": "POST", ":scheme": "http", ":path": "/t/echo", ":authority": "x",
                "content-type": "application/grpc"}
        base.update(headers)
        raw.h2.send_headers(stream, list(base.items()), end_stream=True)
        raw.flush()
        assert raw.finish(stream).headers[":status"] == status
        assert raw.call("/t/echo", b"after").messages() == [b"after"]


def test_a_client_that_is_not_http2_is_sent_goaway() -> None:
    with serving() as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            data = b""
            while chunk := sock.recv(4096):
                data += chunk
        assert data[3] == 0x4  # the server's SETTINGS first (then GOAWAY)
        assert b"not an HTTP/2 client" in data
        _still_served(server)


def test_a_large_answer_waits_for_the_clients_window() -> None:
    """The client gives back its 64 KiB window only when the test says so: the answer comes
    in pieces, each after a WINDOW_UPDATE, whole in the end."""
    payload = bytes(range(256)) * 1024  # 256 KiB
    with serving() as server, client(server) as raw:
        raw.acknowledge = False
        stream = raw.start("/t/echo")
        raw.h2.send_data(stream, grpc_message(payload), end_stream=True)
        raw.flush()
        response = raw.responses[stream]
        raw.wait(lambda: len(response.data) >= 65_535 - 1000, 5)
        raw.receive(0.2)
        assert len(response.data) <= 65_535 and not response.ended
        raw.acknowledge = True
        raw.h2.acknowledge_received_data(len(response.data), stream)
        raw.flush()
        assert raw.finish(stream).messages() == [payload]


def test_a_larger_initial_window_frees_a_blocked_answer() -> None:
    """Blocked by a stream window of 100 bytes, an answer goes on when the client's SETTINGS
    raise the initial window (no WINDOW_UPDATE for the stream)."""
    with serving() as server, client(server) as raw:
        raw.h2.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 100})
        raw.flush()
        raw.receive(0.1)
        raw.acknowledge = False
        stream = raw.start("/t/echo")
        raw.h2.send_data(stream, grpc_message(b"w" * 1000), end_stream=True)
        raw.flush()
        response = raw.responses[stream]
        raw.wait(lambda: len(response.data) >= 100, 2)
        raw.receive(0.1)
        assert len(response.data) == 100 and not response.ended
        raw.h2.update_settings({SettingCodes.INITIAL_WINDOW_SIZE: 1 << 20})
        raw.flush()
        assert raw.finish(stream).messages() == [b"w" * 1000]


def test_streams_count_until_their_handlers_end(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past the limit new streams are refused; a stream the client reset still counts until
    its handler is over (HTTP/2 rapid reset)."""
    monkeypatch.setattr(grpc_connection, "MAX_CONCURRENT_STREAMS", 4)
    with serving() as server, client(server) as raw:
        streams = []
        for _ in range(4):
            stream = raw.start("/t/block")
            raw.h2.send_data(stream, grpc_message(b"x"), end_stream=True)
            streams.append(stream)
        raw.flush()
        raw.wait(lambda: server.handlers.started == 4)
        for stream in streams:
            raw.h2.reset_stream(stream, ErrorCodes.CANCEL)
        raw.flush()
        raw.wait(lambda: server.handlers.cancelled == 4)
        refused = raw.start("/t/echo")
        raw.h2.send_data(refused, grpc_message(b"y"), end_stream=True)
        raw.flush()
        raw.wait(lambda: raw.resets[ErrorCodes.REFUSED_STREAM] == 1)
        assert raw.resets[ErrorCodes.REFUSED_STREAM] == 1
        server.call_soon(server.handlers.release.set)
        raw.receive(0.2)
        assert raw.call("/t/echo", b"z").messages() == [b"z"]


def test_a_reset_or_a_deadline_cancels_the_handler() -> None:
    with serving() as server, client(server) as raw:
        stream = raw.start("/t/block", ("grpc-timeout", "50m"))
        raw.h2.send_data(stream, grpc_message(b"x"), end_stream=True)
        raw.flush()
        response = raw.finish(stream)
        assert (response.status, response.message) == (
            StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded"
        )
        stream = raw.start("/t/block")
        raw.h2.send_data(stream, grpc_message(b"x"), end_stream=True)
        raw.flush()
        raw.wait(lambda: server.handlers.started == 2)
        raw.h2.reset_stream(stream, ErrorCodes.CANCEL)
        raw.flush()
        raw.wait(lambda: server.handlers.cancelled == 2)
        assert server.handlers.cancelled == 2


@pytest.mark.parametrize("timeout", ["400u", "1400u", "20m"])
def test_a_deadline_never_ends_a_call_early(timeout: str) -> None:
    """uvloop's timers count whole milliseconds from the loop's last look at the clock: calls
    with a 400 µs deadline were cancelled after 0.14-0.19 ms, 1.4 ms after 1.27-1.32 ms."""
    with serving() as server, client(server) as raw:
        for _ in range(5):
            # HEADERS and DATA in one write (not ``raw.start``, which flushes the HEADERS): the
            # handler then starts before the shortest deadline has passed.
            stream = raw.h2.get_next_available_stream_id()
            headers = call_headers(server.port, "/t/block", ("grpc-timeout", timeout))
            raw.h2.send_headers(stream, headers)
            raw.h2.send_data(stream, grpc_message(b"x"), end_stream=True)
            raw.flush()
            assert raw.finish(stream).status == StatusCode.DEADLINE_EXCEEDED
        raw.wait(lambda: server.handlers.cancelled == server.handlers.started)
        assert server.handlers.left  # (a handler not started before the deadline is not run)
        assert server.handlers.left == [0.0] * len(server.handlers.left)
        assert raw.call("/t/echo", b"after").messages() == [b"after"]


def test_time_remaining_counts_down_from_the_clients_timeout() -> None:
    with serving() as server, client(server) as raw:
        assert raw.call("/t/remaining", b"", ("grpc-timeout", "3S")).messages() == [b"ok"]
        assert raw.call("/t/remaining", b"").messages() == [b"none"]


def test_an_unread_stream_holds_the_clients_window() -> None:
    """A streaming call whose handler reads nothing gives no window back: the client stops at
    its stream window; once the handler reads, the rest comes and every request is answered."""
    chunk = b"r" * (1 << 16)
    count = 2 * STREAM_WINDOW // len(chunk)
    with serving() as server, client(server) as raw:
        stream = raw.start("/t/stream")
        sent = 0
        while sent < count and raw.h2.local_flow_control_window(stream) >= len(chunk) + 5:
            raw.h2.send_data(stream, grpc_message(chunk))
            raw.flush()
            sent += 1
            raw.receive(0.01)
        raw.receive(0.3)
        assert sent < count
        assert raw.h2.local_flow_control_window(stream) < len(chunk) + 5
        server.call_soon(server.handlers.release.set)
        while sent < count:
            raw.wait(lambda: raw.h2.local_flow_control_window(stream) >= len(chunk) + 5)
            raw.h2.send_data(stream, grpc_message(chunk))
            raw.flush()
            sent += 1
        raw.h2.end_stream(stream)
        raw.flush()
        response = raw.finish(stream, 10)
        assert response.status == 0 and response.messages() == [chunk] * count


def test_pings_are_answered() -> None:
    with serving() as server, client(server) as raw:
        raw.h2.ping(b"12345678")
        raw.flush()
        raw.wait(lambda: raw.pings_acked == 1)
        assert raw.pings_acked == 1


def test_going_away_finishes_open_calls_then_closes() -> None:
    """GOAWAY NO_ERROR: the call already open is answered, then the connection closes; the
    client's next call goes over a new connection."""
    with serving() as server, grpc.insecure_channel(f"127.0.0.1:{server.port}") as channel:
        block: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/t/block")
        echo: grpc.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary("/t/echo")
        assert echo(b"first", timeout=5) == b"first"
        future = block.future(b"open", timeout=10)
        deadline = time.monotonic() + 5
        while server.handlers.started == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        [connection] = list(server.service.connections)
        server.call_soon(connection.go_away)
        time.sleep(0.1)
        server.call_soon(server.handlers.release.set)
        assert future.result() == b"open"
        server.run(asyncio.wait_for(connection.closed, 5))
        assert echo(b"again", timeout=5) == b"again"




@pytest.mark.parametrize("frame_size", [16_384, 100_000, 1 << 20])
def test_a_large_request_is_received_into_a_pooled_buffer(frame_size: int) -> None:
    """The handler gets a view of the pool's buffer (filled straight from the socket where a
    DATA frame allows), which goes back once the handler is over; small requests are not
    pooled."""
    pool = Pool()
    payload = bytes(range(256)) * 1000
    wire = grpc_message(payload)
    with serving(buffers=pool) as server, client(server) as raw:
        stream = _send_in_frames(raw, "/t/echo", wire, frame_size)
        assert raw.finish(stream).messages() == [payload]
        [buffer] = pool.given
        assert server.handlers.buffers == [buffer]
        assert bytes(buffer.view) == payload and buffer.released == 1
        assert raw.call("/t/echo", b"small").messages() == [b"small"]
        assert len(pool.given) == 1 and server.handlers.buffers[-1] is None


def test_a_pooled_request_given_up_returns_its_buffer() -> None:
    pool = Pool()
    wire = grpc_message(b"p" * 200_000)
    with serving(buffers=pool) as server, client(server) as raw:
        stream = raw.start("/t/echo")
        raw.h2.send_data(stream, wire[:100_000])
        raw.flush()
        raw.wait(lambda: bool(pool.given))
        raw.h2.reset_stream(stream, ErrorCodes.CANCEL)
        raw.flush()
        raw.wait(lambda: pool.given[0].released == 1)
        assert pool.given[0].released == 1
        stream = raw.start("/t/echo")
        raw.h2.send_data(stream, wire[:100_000])
        raw.flush()
        raw.wait(lambda: len(pool.given) == 2)
    assert pool.given[1].released == 1  # the connection closed mid-message


@pytest.mark.parametrize("frame_size", [16_384, 1 << 20])
def test_each_large_message_of_a_stream_comes_in_a_pooled_buffer_its_handler_owns(
    frame_size: int,
) -> None:
    """The handler iterates the buffers themselves (it releases each once its request is
    answered); small messages come as bytes."""
    pool = Pool()
    large = [bytes([i]) * 100_000 for i in (1, 2)]
    wire = grpc_message(large[0]) + grpc_message(b"small") + grpc_message(large[1])
    with serving(buffers=pool) as server, client(server) as raw:
        stream = _send_in_frames(raw, "/t/own_stream", wire, frame_size)
        response = raw.finish(stream)
        assert response.status == 0
        assert response.messages() == [large[0], b"small", large[1]]
        assert server.handlers.buffers == pool.given and len(pool.given) == 2
        assert [buffer.released for buffer in pool.given] == [1, 1]


def test_pooled_stream_messages_nobody_read_go_back_when_the_stream_ends() -> None:
    """Read or not, cut short or whole: every pooled buffer of a reset stream is released."""
    pool = Pool()
    wire = grpc_message(b"u" * 100_000)
    with serving(buffers=pool) as server, client(server) as raw:
        stream = raw.start("/t/stream")  # reads nothing until ``release``
        raw.h2.send_data(stream, wire + wire + wire[:50_000])
        raw.flush()
        raw.wait(lambda: len(pool.given) == 3)
        raw.h2.reset_stream(stream, ErrorCodes.CANCEL)
        raw.flush()
        raw.wait(lambda: all(buffer.released for buffer in pool.given))
        assert [buffer.released for buffer in pool.given] == [1, 1, 1]
        _still_served(server)


def test_a_stream_message_that_finds_the_pool_full_comes_as_bytes() -> None:
    """Refusing it would end the whole stream: it is kept in its own bytes, as a small one."""
    pool = Pool()
    pool.full = True
    with serving(buffers=pool) as server, client(server) as raw:
        stream = raw.start("/t/own_stream")
        raw.h2.send_data(stream, grpc_message(b"f" * 100_000), end_stream=True)
        raw.flush()
        response = raw.finish(stream)
        assert response.status == 0 and response.messages() == [b"f" * 100_000]
        assert pool.given == [] and server.handlers.buffers == []


def test_a_full_pool_refuses_the_request_before_storing_it() -> None:
    pool = Pool()
    pool.full = True
    with serving(buffers=pool) as server, client(server) as raw:
        response = raw.call("/t/echo", b"q" * 200_000)
        assert (response.status, response.message) == (
            StatusCode.UNAVAILABLE, "the server is busy: no free block"
        )
        assert server.handlers.buffers == []
        pool.full = False
        assert raw.call("/t/echo", b"r" * 200_000).messages() == [b"r" * 200_000]


def test_a_long_status_message_is_cut() -> None:
    with serving() as server, client(server) as raw:
        response = raw.call("/t/long_abort", b"")
        assert response.status == StatusCode.INVALID_ARGUMENT
        assert response.message.startswith("%C3%BC") and len(response.message) <= 4096
        assert response.message.endswith("%BC")  # never inside an escape


def test_a_streaming_handler_cleans_up_when_its_client_resets() -> None:
    """At once, not when the garbage collector finds its generator (the stream counts until
    then)."""
    with serving() as server, client(server) as raw:
        stream = raw.start("/t/ticks")
        raw.h2.send_data(stream, grpc_message(b""), end_stream=True)
        raw.flush()
        raw.wait(lambda: len(raw.responses[stream].data) > 0)
        raw.h2.reset_stream(stream, ErrorCodes.CANCEL)
        raw.flush()
        raw.wait(lambda: server.handlers.cleaned_up == 1, 2)
        assert server.handlers.cleaned_up == 1


def test_a_deadline_behind_untaken_data_resets_the_stream() -> None:
    """The answer waits for a window the client never gives back: at the deadline the stream
    is reset (CANCEL), since its status cannot go out."""
    with serving() as server, client(server) as raw:
        raw.acknowledge = False
        stream = raw.start("/t/echo", ("grpc-timeout", "200m"))
        raw.h2.send_data(stream, grpc_message(b"d" * 200_000), end_stream=True)
        raw.flush()
        response = raw.finish(stream, 3)
        assert response.reset == ErrorCodes.CANCEL
        _still_served(server)


def test_a_header_list_past_the_announced_limit_fails_its_call_alone() -> None:
    with serving() as server, client(server) as raw:
        response = raw.call("/t/echo", b"x", ("x-big", "b" * 70_000))
        assert response.status == StatusCode.RESOURCE_EXHAUSTED
        assert response.message.startswith("received metadata size exceeds limit")
        assert raw.call("/t/echo", b"y").messages() == [b"y"]


def test_a_pool_out_of_memory_refuses_the_request() -> None:
    class Starved(Pool):
        def acquire(self, nbytes: int) -> Buffer:
            raise MemoryError

    with serving(buffers=Starved()) as server, client(server) as raw:
        response = raw.call("/t/echo", b"m" * 200_000)
        assert response.status == StatusCode.RESOURCE_EXHAUSTED
        assert raw.call("/t/echo", b"n").messages() == [b"n"]
