"""Closed-loop load generators: each concurrency slot keeps exactly one request in flight.

A request is encoded once and the same bytes are sent every time (``--cache-hit-ratio`` makes
some of them new, ``server.loadtest.cache_mix``), and responses are only
framed, never decoded (the first one is kept to be checked), so that a client process spends
as little CPU per request as Python allows. HTTP uses one keep-alive connection per slot on
asyncio's buffered protocol; gRPC uses grpc.aio with identity (de)serializers, the slots of a
process sharing its channel(s). The ``scripts/bench_*.py`` benchmarks use the same framing and
gRPC generator.
"""

from __future__ import annotations

import asyncio
import re
import time
from typing import Any, TypeVar

import grpc

from server.loadtest.cache_mix import RequestStream
from server.loadtest.measurements import Sample

#: A call still unanswered this long after the end of its run is given up as an error.
STALL_S = 60.0
#: gRPC message limit both ways: INT32_MAX, as Triton's clients set it.
MAX_GRPC_MESSAGE = 2**31 - 1
MODEL_INFER = "/inference.GRPCInferenceService/ModelInfer"
_CONNECT_S = 30.0
_CONTENT_LENGTH = re.compile(rb"\r\ncontent-length:\s*(\d+)", re.IGNORECASE)

SampleT = TypeVar("SampleT", bound=Sample)


class HttpFraming:
    """HTTP/1.1 responses delimited by Content-Length (what the V2 servers send)."""

    def response_length(self, buffer: bytearray, filled: int) -> int | None:
        """The full response length once the head has arrived, else None."""
        end = buffer.find(b"\r\n\r\n", 0, filled)
        if end < 0:
            return None
        match = _CONTENT_LENGTH.search(bytes(buffer[:end]))
        if match is None:
            raise ConnectionError("response without Content-Length")
        return end + 4 + int(match.group(1))

    def ok(self, response: memoryview) -> bool:
        return response[9:12].tobytes() == b"200"


def http_error_text(response: memoryview | bytes) -> str:
    """The status line and the start of the body of a failed response, for a user to read."""
    raw = bytes(response[:600])
    head, _, body = raw.partition(b"\r\n\r\n")
    status = head.split(b"\r\n", 1)[0].decode("latin-1")
    return f"{status}: {body[:300].decode('utf-8', 'replace')}".rstrip(": ")


# --- HTTP -------------------------------------------------------------------------------------


class _Connection(asyncio.BufferedProtocol):
    """One slot's keep-alive connection; the response lands in a buffer reused every time."""

    def __init__(self, owner: HttpLoadGenerator, capacity: int) -> None:
        self._owner = owner
        self._buffer = bytearray(capacity)
        self._view = memoryview(self._buffer)
        self._filled = 0
        self._length: int | None = None
        self.transport: asyncio.Transport | None = None
        self.in_flight = False
        self.lost = False
        self.started = 0.0
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def send(self, request: bytes) -> None:
        assert self.transport is not None
        self._filled, self._length = 0, None
        self.in_flight = True
        self.started = time.perf_counter()
        self.transport.write(request)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._filled == len(self._buffer):
            self._grow(2 * len(self._buffer))
        return self._view[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if not self.in_flight:
            self._fail("bytes from the server with no request in flight")
            return
        try:
            if self._length is None:
                self._length = self._owner.framing.response_length(self._buffer, self._filled)
                if self._length is not None and self._length > len(self._buffer):
                    self._grow(self._length)
        except ConnectionError as exc:
            self._fail(str(exc))
            return
        if self._length is None or self._filled < self._length:
            return
        if self._filled > self._length:
            self._fail("bytes after the end of the response")
            return
        self.in_flight = False
        self._owner.answered(self, self._view[: self._length])

    def eof_received(self) -> bool:
        return False  # close the transport; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if not self.closed.done():
            self.closed.set_result(None)
        if self.in_flight:
            self.in_flight = False
            self._owner.failed(self, f"connection lost: {exc or 'closed by the server'}")

    def abort(self) -> None:
        self.lost = True
        self.in_flight = False
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, message: str) -> None:
        was_in_flight = self.in_flight
        self.abort()
        if was_in_flight:
            self._owner.failed(self, message)

    def _grow(self, size: int) -> None:
        buffer = bytearray(size)
        buffer[: self._filled] = self._view[: self._filled]
        self._view.release()
        self._buffer, self._view = buffer, memoryview(buffer)


class HttpLoadGenerator:
    """Closed-loop HTTP/1.1 load on asyncio: ``concurrency`` keep-alive connections, each
    sending the same pre-encoded request again as soon as the previous response has arrived in
    full (no pipelining). Everything happens in protocol callbacks, with no task per request."""

    def __init__(
        self,
        address: tuple[str, int],
        request: bytes | RequestStream,
        concurrency: int,
        response_capacity: int = 1 << 16,
    ) -> None:
        self._address = address
        self._requests = request if isinstance(request, RequestStream) else RequestStream(
            request, None
        )
        self._concurrency = concurrency
        self._capacity = response_capacity
        self.framing = HttpFraming()
        self._connections: list[_Connection] = []
        self._sample = Sample()
        self._deadline = 0.0
        self._issued = 0
        self._max_requests = 0
        self._active = 0
        self._done: asyncio.Future[None] | None = None
        self._reconnecting: set[asyncio.Task[None]] = set()  # the loop keeps weak references

    async def _open(self) -> _Connection:
        loop = asyncio.get_running_loop()
        _, protocol = await asyncio.wait_for(
            loop.create_connection(lambda: _Connection(self, self._capacity), *self._address),
            _CONNECT_S,
        )
        return protocol

    async def connect(self) -> None:
        self._connections = [await self._open() for _ in range(self._concurrency)]

    async def close(self) -> None:
        """Close every connection and wait (briefly) until the loop has let go of them."""
        for connection in self._connections:
            if connection.transport is not None:
                connection.transport.close()
        if self._connections:
            await asyncio.wait([c.closed for c in self._connections], timeout=_CONNECT_S)
        self._connections = []

    async def run_for(self, seconds: float, max_requests: int, into: SampleT) -> SampleT:
        """Keep every connection busy for ``seconds`` or until ``max_requests`` were sent, then
        wait for the requests in flight; what was measured goes ``into`` the sample given."""
        for index, connection in enumerate(self._connections):
            if connection.lost:  # closed by the server between runs
                self._connections[index] = await self._open()
        loop = asyncio.get_running_loop()
        self._sample = into
        self._done = loop.create_future()
        self._issued, self._max_requests = 0, max_requests
        client_cpu = time.process_time()
        start = time.perf_counter()
        self._deadline = start + seconds
        starting = self._connections[: max(0, max_requests)]
        self._active = len(starting)
        for connection in starting:
            self._issued += 1
            connection.send(self._requests.next())
        if self._active:
            try:
                await asyncio.wait_for(asyncio.shield(self._done), seconds + STALL_S)
            except TimeoutError:
                for connection in self._connections:
                    if connection.in_flight:
                        connection.abort()
                        into.note_error(f"no response within {seconds + STALL_S:g} s")
        into.elapsed = time.perf_counter() - start
        into.client_cpu = time.process_time() - client_cpu
        return into

    def answered(self, connection: _Connection, response: memoryview) -> None:
        sample = self._sample
        if not sample.first_response:
            sample.first_response = bytes(response)
        if self.framing.ok(response):
            sample.latencies.append(time.perf_counter() - connection.started)
            sample.requests += 1
        else:
            sample.note_error(http_error_text(response))
        transport = connection.transport
        if transport is not None and transport.get_write_buffer_size():
            # Answered before the whole request went out (an early error): the rest of the
            # request would be read as the next one, so this connection cannot be reused.
            connection.abort()
        self._next(connection)

    def failed(self, connection: _Connection, message: str) -> None:
        self._sample.note_error(message)
        self._next(connection)

    def _next(self, connection: _Connection) -> None:
        """Send again on this slot, or retire it once the run is over."""
        if time.perf_counter() < self._deadline and self._issued < self._max_requests:
            self._issued += 1
            if connection.lost:
                task = asyncio.ensure_future(self._resend_on_new_connection(connection))
                self._reconnecting.add(task)
                task.add_done_callback(self._reconnecting.discard)
            else:
                connection.send(self._requests.next())
            return
        self._active -= 1
        if self._active == 0 and self._done is not None and not self._done.done():
            self._done.set_result(None)

    async def _resend_on_new_connection(self, lost: _Connection) -> None:
        """Replace a connection the server closed and send on it; if the server cannot be
        reached any more, the request is an error and the slot retires."""
        try:
            fresh = await self._open()
        except (OSError, TimeoutError) as exc:
            self._sample.note_error(f"cannot reconnect: {exc}")
            self._issued = self._max_requests  # stop issuing: the server is gone
            self._next(lost)
            return
        self._connections[self._connections.index(lost)] = fresh
        fresh.send(self._requests.next())


# --- gRPC -------------------------------------------------------------------------------------


def identity(data: bytes) -> bytes:
    """gRPC (de)serializer for calls whose messages are already bytes."""
    return data


class GrpcLoadGenerator:
    """Closed-loop load over grpc.aio: ``concurrency`` coroutines, each sending the same
    pre-serialized ``ModelInferRequest`` again as soon as the previous response has arrived,
    on ``channels`` channels (each its own TCP connection)."""

    def __init__(
        self,
        address: tuple[str, int],
        request: bytes | RequestStream,
        concurrency: int,
        channels: int = 1,
    ) -> None:
        host = f"[{address[0]}]" if ":" in address[0] else address[0]
        options = [
            ("grpc.max_send_message_length", MAX_GRPC_MESSAGE),
            ("grpc.max_receive_message_length", MAX_GRPC_MESSAGE),
            # Without this, channels to one target share a subchannel (one TCP connection).
            ("grpc.use_local_subchannel_pool", 1),
        ]
        self._requests = request if isinstance(request, RequestStream) else RequestStream(
            request, None
        )
        self._concurrency = concurrency
        self._channels = [
            grpc.aio.insecure_channel(f"{host}:{address[1]}", options=options)
            for _ in range(channels)
        ]
        self._calls = [
            channel.unary_unary(
                MODEL_INFER, request_serializer=identity, response_deserializer=identity
            )
            for channel in self._channels
        ]

    async def connect(self) -> None:
        for channel in self._channels:
            await asyncio.wait_for(channel.channel_ready(), _CONNECT_S)

    async def close(self) -> None:
        for channel in self._channels:
            await channel.close()

    async def run_for(self, seconds: float, max_requests: int, into: SampleT) -> SampleT:
        """Keep ``concurrency`` calls in flight for ``seconds`` or until ``max_requests`` were
        sent, then wait for those in flight; what was measured goes ``into`` the sample."""
        issued = 0
        client_cpu = time.process_time()
        start = time.perf_counter()
        deadline = start + seconds
        timeout = seconds + STALL_S

        async def loop(call: Any) -> None:
            nonlocal issued
            while True:
                issued += 1
                began = time.perf_counter()
                try:
                    response = await call(self._requests.next(), timeout=timeout)
                except grpc.aio.AioRpcError as exc:
                    message = f"{exc.code().name}: {exc.details()}"
                    into.note_error(message)
                else:
                    into.latencies.append(time.perf_counter() - began)
                    into.requests += 1
                    if not into.first_response:
                        into.first_response = response
                if time.perf_counter() >= deadline or issued >= max_requests:
                    return

        slots = min(self._concurrency, max_requests)
        await asyncio.gather(*(loop(self._calls[i % len(self._calls)]) for i in range(slots)))
        into.elapsed = time.perf_counter() - start
        into.client_cpu = time.process_time() - client_cpu
        return into
