"""One gRPC call: an HTTP/2 stream's request messages in, its handler, its response out.

A call is also its handler's context (``CallContext``): the metadata the client sent, ``abort``
to end the call with a status. Handlers are shaped as ``grpc.aio``'s servicers: ``(request,
context)`` returning the response, or an async iterator of responses; a streaming request is
an async iterator of messages.

Request messages are gRPC's length-prefixed messages (a compressed flag, a 4-byte length)
split over DATA frames as the client pleases; they are put together here. The stream's window
is given back as the bytes arrive while the handler waits for them (a unary request, a stream
being read) and held while messages wait unread, so that a client whose stream the server
does not read is held back by HTTP/2 flow control, not buffered without bound.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import math
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from server import compression, eager
from server.errors import InferenceServerError
from server.grpc.headers import RequestHead
from server.grpc.status import AbortError, StatusCode, status_code
from server.memory.host_pool import PooledBuffer
from server.threads import run_in_thread

if TYPE_CHECKING:
    from server.grpc.connection import Http2Connection

log = logging.getLogger("server.grpc")

#: A request message as the handler gets it: its own bytes, or a view of a pooled buffer.
Message = bytes | bytearray | memoryview
#: A message of a raw streaming method as its handler iterates it: its own bytes, or (a large
#: one) the pooled buffer it was received in, which the handler now owns and releases.
StreamMessage = Message | PooledBuffer
#: A message as it came: its compressed flag and its bytes (inflated on a thread, see
#: ``Call._inflated``).
_Received = tuple[int, StreamMessage]
#: The types of a message in its own bytes (``isinstance``: the rest are pooled buffers).
OWN_BYTES = (bytes, bytearray, memoryview)


@dataclass(frozen=True, slots=True)
class Views:
    """A response message in parts that view memory owned elsewhere (the executor's output
    arena): they are written (or compressed) as they are, not joined, and ``release`` is
    called once the kernel has taken all of them, or once they will never be sent (the stream
    reset, the connection gone)."""

    parts: list[bytes | memoryview]
    release: Callable[[], None]

    @property
    def size(self) -> int:
        return sum(len(part) for part in self.parts)


#: A response message of a raw method's handler.
Payload = bytes | Views


def payload_size(payload: Payload) -> int:
    return payload.size if isinstance(payload, Views) else len(payload)


def discard(payload: Payload) -> None:
    """A response message that will not be sent: the memory it views goes back."""
    if isinstance(payload, Views):
        payload.release()


#: gRPC's message prefix: a compressed flag and a big-endian 4-byte length.
PREFIX_SIZE = 5
DEADLINE_EXCEEDED = "Deadline Exceeded"
#: A request message of a raw method (ModelInfer, each of ModelStreamInfer's) at least this
#: large is put together in a buffer of the service's pool (the front end's arena), read there
#: straight from the socket: its tensors then cross to the executor, and with a GPU to the
#: device, without another copy.
POOLED_MESSAGE_BYTES = 1 << 16
#: A response message larger than this is compressed on a thread (zlib's default level takes
#: about a millisecond per 64 KiB: longer than a thread hop).
COMPRESS_ON_LOOP_BYTES = 1 << 14
#: A call refused before its handler runs is answered at its first request message, or this
#: long after its HEADERS if none comes (see ``Call.refuse``).
REFUSAL_DELAY_S = 0.1


class CallContext(Protocol):
    """What a handler may ask of its call."""

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]: ...

    def time_remaining(self) -> float | None:
        """Seconds left before the call's deadline (None: it has none), as grpcio's."""
        ...

    async def abort(self, code: StatusCode, details: str) -> None: ...

    @property
    def request_buffer(self) -> PooledBuffer | None:
        """The pooled buffer a unary request given as a ``memoryview`` lies in (None: the
        request is ``bytes`` of its own)."""
        ...


@dataclass(frozen=True)
class Method:
    """An RPC the server answers: its handler, the kinds of its request and response (a
    streaming request has a streaming response: the services here have no other kind), how
    its messages are read and written (None: the handler takes and gives bytes; then large
    request messages are pooled, see ``POOLED_MESSAGE_BYTES``), and its category for
    ``--grpc-restricted-protocol``."""

    handler: Callable[..., Any]
    request_streaming: bool = False
    response_streaming: bool = False
    deserialize: Callable[[bytes], Any] | None = None
    serialize: Callable[[Any], bytes] | None = None
    category: str | None = None
    #: ``--grpc-infer-response-compression-level`` for its responses (the infer methods)
    compression: str = "none"


class CallError(Exception):
    """A request the call cannot take (a malformed or oversize message): the call ends with
    ``code`` and ``message``."""

    def __init__(self, code: StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class Call:
    """One stream of ``connection``, id ``stream_id``, calling ``method``."""

    __slots__ = (
        "_deadline",
        "_finished",
        "_flag",
        "_left",
        "_message",
        "_messages",
        "_pooled",
        "_prefix",
        "_reader",
        "_refusal",
        "_request",
        "_timer",
        "connection",
        "head",
        "headers_sent",
        "id",
        "local_closed",
        "method",
        "outgoing",
        "queued",
        "recv_window",
        "releases",
        "remote_closed",
        "response_encoding",
        "send_window",
        "sent",
        "task",
        "trailers",
        "unacked",
        "waiters",
    )

    def __init__(
        self,
        connection: Http2Connection,
        stream_id: int,
        head: RequestHead,
        method: Method | None,
        send_window: int,
        recv_window: int,
    ) -> None:
        self.connection = connection
        self.id = stream_id
        self.head = head
        self.method = method
        # HTTP/2: flow control and the two halves of the stream.
        self.send_window = send_window
        self.recv_window = recv_window  # bytes the client may still send
        self.unacked = 0  # bytes received whose window has not been given back
        self.remote_closed = False  # END_STREAM or RST_STREAM received
        self.local_closed = False  # END_STREAM or RST_STREAM sent
        self.headers_sent = False
        self.outgoing: collections.deque[bytes | memoryview] = collections.deque()
        self.queued = 0  # bytes ever put in ``outgoing``
        self.sent = 0  # of which written
        self.trailers: bytes | None = None  # to send once ``outgoing`` is empty
        self.waiters: collections.deque[tuple[int, asyncio.Future[None]]] = collections.deque()
        #: each queued ``Views`` message's release, with ``queued`` at its end
        self.releases: collections.deque[tuple[int, Callable[[], None]]] = collections.deque()
        self.task: asyncio.Task[None] | None = None
        # gRPC: the request messages.
        self._prefix = b""
        self._flag = 0
        self._message: bytearray | None = None  # the message being put together
        self._pooled: PooledBuffer | None = None  # ... or the pool's buffer it goes into
        self._left = 0  # its bytes still to come
        self._messages: collections.deque[_Received] = collections.deque()
        self._reader: asyncio.Future[None] | None = None
        # a unary request's one message (a view of ``_pooled`` when pooled)
        self._request: _Received | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._deadline = 0.0  # the call's end (``time.monotonic``), when it has a timeout
        self._finished = False
        self._refusal: tuple[StatusCode, str] | None = None
        #: what the response messages are compressed with (None: identity)
        self.response_encoding = (
            None if method is None or method.compression == "none"
            else compression.grpc_algorithm(method.compression, head.accepted)
        )

    # --- the handler's context ------------------------------------------------------------

    def invocation_metadata(self) -> tuple[tuple[str, str | bytes], ...]:
        return self.head.metadata

    def time_remaining(self) -> float | None:
        if self.head.timeout is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    async def abort(self, code: StatusCode, details: str) -> None:
        raise AbortError(code, details)

    @property
    def request_buffer(self) -> PooledBuffer | None:
        return self._pooled if self._left == 0 else None

    # --- start ----------------------------------------------------------------------------

    def start(self) -> None:
        """The call's HEADERS are in: run its handler now if it streams its requests (it
        reads them as they come), else once the request is complete."""
        timeout = self.head.timeout
        if timeout is not None:
            self._deadline = time.monotonic() + timeout
            self._timer = self.connection.loop.call_later(timeout, self._expire)
        method = self.method
        assert method is not None
        if method.request_streaming:
            self._run(self._serve_stream(None))

    def refuse(self, code: StatusCode, message: str) -> None:
        """End the call with ``code`` without running a handler: once its first request
        message (or its end) has come, or after ``REFUSAL_DELAY_S``. Not at once: a grpc.aio
        client whose stream has ended before it sent its first message reports INTERNAL
        ("Internal error from Core", its send failed) instead of the status (49 of 50
        refused ModelStreamInfer calls did, answered on their HEADERS)."""
        self._refusal = (code, message)
        self._timer = self.connection.loop.call_later(REFUSAL_DELAY_S, self._refuse_now)

    def _refuse_now(self) -> None:
        if self._refusal is not None:
            self.finish(*self._refusal)  # (which stops the timer, if this is not it)

    def _run(self, coroutine: Any) -> None:
        task = eager.start(coroutine, self.connection.loop)
        if task is not None:
            self.task = task
            task.add_done_callback(self._handler_done)
        else:
            self.connection.call_done(self)

    def _handler_done(self, _: asyncio.Task[None]) -> None:
        self.task = None
        self.connection.call_done(self)

    # --- request messages -----------------------------------------------------------------

    @property
    def holds_unread(self) -> bool:
        """Messages wait that the handler has not read: the window is not given back."""
        return bool(self._messages)

    def data(self, chunk: memoryview) -> None:
        """Request bytes of a DATA frame; ``CallError`` for a message the call refuses."""
        if self._refusal is not None:
            self._refuse_now()
            return
        pos, end = 0, len(chunk)
        while pos < end:
            if self._left == 0:  # at a message's prefix
                if not self._prefix and end - pos >= PREFIX_SIZE:
                    flag, length = chunk[pos], int.from_bytes(chunk[pos + 1 : pos + 5], "big")
                    pos += PREFIX_SIZE
                else:
                    taken = chunk[pos : pos + PREFIX_SIZE - len(self._prefix)].tobytes()
                    self._prefix += taken
                    pos += len(taken)
                    if len(self._prefix) < PREFIX_SIZE:
                        return
                    flag, length = self._prefix[0], int.from_bytes(self._prefix[1:], "big")
                    self._prefix = b""
                self._check(flag, length)
                if length < POOLED_MESSAGE_BYTES or flag or not self._pool_message(length):
                    if end - pos >= length:  # all of it here (a small message, nearly always)
                        self._deliver(flag, chunk[pos : pos + length].tobytes())
                        pos += length
                        continue
                    self._message = bytearray()
                self._flag, self._left = flag, length
            taken_view = chunk[pos : pos + self._left]
            pos += len(taken_view)
            self.filled(taken_view)

    def _pool_message(self, length: int) -> bool:
        """Put the message coming next together in a pooled buffer, when this call's messages
        go into one: a raw method's, unary or each of a stream's. Whether it does: a stream's
        message that finds the pool full is put together in its own bytes (failing it would
        end the stream); a unary request is refused, before it is stored."""
        buffers = self.connection.service.buffers
        method = self.method
        if buffers is None or method is None or method.deserialize is not None or self._finished:
            return False  # (a finished call handles no more messages: no block for them)
        streaming = method.request_streaming
        if not streaming and method.response_streaming:
            return False
        try:
            self._pooled = buffers.acquire(length)
        except InferenceServerError as error:  # the arena is full
            if streaming:
                return False
            raise CallError(status_code(error), error.message) from None
        except MemoryError:
            if streaming:
                return False
            raise CallError(
                StatusCode.RESOURCE_EXHAUSTED, f"no memory for a {length}-byte request"
            ) from None
        self._message = None
        return True

    @property
    def pooled_space(self) -> memoryview | None:
        """Where the rest of the pooled message being read goes (None: no such message)."""
        pooled = self._pooled
        if pooled is None or self._left == 0:
            return None
        return pooled.view[len(pooled.view) - self._left :]

    def filled(self, part: memoryview) -> None:
        """``part`` of the message being read, copied into place."""
        if self._message is not None:
            self._message += part
        elif self._pooled is not None:
            view = self._pooled.view
            start = len(view) - self._left
            view[start : start + len(part)] = part
        self._advance(len(part))

    def filled_in_place(self, nbytes: int) -> None:
        """``nbytes`` of the message were read straight into ``pooled_space``."""
        self._advance(nbytes)

    def _advance(self, taken: int) -> None:
        self._left -= taken
        if self._left == 0:
            if self._message is not None:
                message, self._message = self._message, None
                self._deliver(self._flag, message)
            elif self._pooled is not None:
                if self.method is not None and self.method.request_streaming:
                    pooled, self._pooled = self._pooled, None  # the handler's, once read
                    self._deliver(self._flag, pooled)
                else:
                    self._deliver(self._flag, self._pooled.view)

    def _check(self, flag: int, length: int) -> None:
        if flag > 1:
            raise CallError(StatusCode.INTERNAL, f"invalid gRPC message flag {flag}")
        limit = self.connection.service.max_message_size
        if length > limit:
            raise CallError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max ({length} vs. {limit})",
            )
        if self.method is not None and not self.method.request_streaming and (
            self._request is not None
        ):
            raise CallError(StatusCode.INTERNAL, "more than one request message in a unary call")

    def _deliver(self, flag: int, message: StreamMessage) -> None:
        if self.method is not None and self.method.request_streaming:
            if self._finished:  # nobody will read it
                _drop(message)
                return
            self._messages.append((flag, message))
            self._wake_reader()
        else:
            assert isinstance(message, OWN_BYTES)
            self._request = (flag, message)

    def _drop_unread(self) -> None:
        """Messages of a stream whose handler is over: their pooled buffers go back."""
        messages, self._messages = self._messages, collections.deque()
        for _, message in messages:
            _drop(message)

    async def _inflated(self, received: _Received) -> StreamMessage:
        """A message as the handler takes it: inflated, on a thread (a small message can
        inflate to up to the message limit); ``CallError`` for one that does not inflate."""
        flag, message = received
        if not flag:
            return message
        assert isinstance(message, OWN_BYTES)  # (compressed messages are not pooled)
        return await run_in_thread(self._inflate, message)

    def _inflate(self, message: Message) -> bytes:
        encoding = self.head.encoding
        if encoding not in ("gzip", "deflate"):
            raise CallError(
                StatusCode.INTERNAL, f"a compressed message with grpc-encoding '{encoding[:100]}'"
            )
        limit = self.connection.service.max_message_size
        try:
            return compression.inflate(message, limit)
        except compression.TooLarge:
            raise CallError(
                StatusCode.RESOURCE_EXHAUSTED,
                f"Received message larger than max (more than {limit} bytes once decompressed)",
            ) from None
        except compression.InflateError as exc:
            raise CallError(StatusCode.INTERNAL, f"cannot decompress the message: {exc}") from None

    def end_of_requests(self) -> None:
        """The client has half-closed (END_STREAM): a unary request is complete."""
        self.remote_closed = True
        if self._refusal is not None:
            self._refuse_now()
            return
        method = self.method
        if method is None or self._finished:
            return
        if method.request_streaming:
            self._release_pooled()  # a message cut short: never delivered
            self._wake_reader()
            return
        if self._left or self._prefix:
            self.finish(StatusCode.INTERNAL, "the request ended inside a message")
            self._release_pooled()
            self.connection.call_done(self)
        elif self._request is None:
            self.finish(StatusCode.INTERNAL, "Missing request message")
            self.connection.call_done(self)
        else:
            request, self._request = self._request, None
            if method.response_streaming:
                self._run(self._serve_stream(request))
            else:
                self._run(self._serve_unary(request))

    async def read(self) -> StreamMessage | None:
        """The next request message of a streaming call; None once the client has sent all.
        ``CallError`` for one that does not inflate."""
        while not self._messages:
            if self.remote_closed:
                return None
            self._reader = self.connection.loop.create_future()
            try:
                await self._reader
            finally:
                self._reader = None
        received = self._messages.popleft()
        if not self._messages:
            self.connection.give_back_window(self)
        return await self._inflated(received)

    def _wake_reader(self) -> None:
        if self._reader is not None and not self._reader.done():
            self._reader.set_result(None)

    # --- the handler ----------------------------------------------------------------------

    async def _serve_unary(self, request: _Received) -> None:
        try:
            await self._answer_unary(request)
        finally:
            self._release_pooled()

    async def _argument(self, request: _Received) -> Any:
        """The handler's argument: the request inflated and, unless raw, deserialized; None
        (the call ended) for one that is neither."""
        method = self.method
        assert method is not None
        try:
            message = await self._inflated(request)
            assert isinstance(message, OWN_BYTES)  # (a unary request is never handed over)
            return _deserialized(method, message)
        except CallError as error:
            self.finish(error.code, error.message)
            return None

    async def _answer_unary(self, request: _Received) -> None:
        method = self.method
        assert method is not None
        argument = await self._argument(request)
        if argument is None:
            return
        try:
            response = await method.handler(argument, self)
            payload = response if method.serialize is None else method.serialize(response)
            payload, compressed = await self._encoded(payload)
        except AbortError as error:
            self.finish(error.code, error.message)
        except Exception as exc:  # noqa: BLE001 - a handler's fault fails its call alone
            self._failed(exc)
        else:
            if self._finished:
                discard(payload)
            else:
                self._finished = True
                self.connection.reply(self, payload, compressed)

    async def _encoded(self, payload: Payload) -> tuple[Payload, bool]:
        """``payload`` as it goes out: compressed with the call's encoding, and whether it
        was."""
        if self.response_encoding is None:
            return payload, False
        return await _compressed(payload, self.response_encoding)

    async def _serve_stream(self, request: _Received | None) -> None:
        """A response-streaming call (the only kind a streaming request has here): its
        handler's replies as they come; ``request`` is a unary request (None: a stream)."""
        method = self.method
        assert method is not None
        if request is None:
            argument: Any = _Requests(self)
        else:
            argument = await self._argument(request)
            if argument is None:
                return
        replies = method.handler(argument, self)
        try:
            async for response in replies:
                if self._finished:
                    discard(response)
                    break
                await self.send(response if method.serialize is None else method.serialize(response))
        except AbortError as error:
            self.finish(error.code, error.message)
        except Exception as exc:  # noqa: BLE001 - a handler's fault fails its call alone
            self._failed(exc)
        else:
            self.finish(StatusCode.OK, "")
        finally:
            # Its own clean-up (a stream's running requests stopped) runs now, not when the
            # collector finds it, and the call counts until it has.
            await replies.aclose()
            # (The call is finished: messages still to come are dropped as they complete.)
            self._release_pooled()
            self._drop_unread()

    def _failed(self, exc: Exception) -> None:
        log.error("an RPC handler of %s failed", self.head.path, exc_info=exc)
        self.finish(StatusCode.UNKNOWN, f"Unexpected {type(exc)}: {exc}")

    async def send(self, payload: Payload) -> None:
        """Send one response message; return once flow control has taken all of it."""
        if self._finished:
            discard(payload)
            return
        payload, compressed = await self._encoded(payload)
        if self._finished:
            discard(payload)
            return
        sent = self.connection.send_message(self, payload, compressed)
        if sent is not None:
            await sent

    def finish(self, code: StatusCode, message: str) -> None:
        """End the call with its status (the first ending counts)."""
        if self._finished:
            return
        self._finished = True
        self.connection.send_status(self, code, message)

    # --- the end --------------------------------------------------------------------------

    def _expire(self) -> None:
        left = self._deadline - time.monotonic()
        if left > 0:
            # Early: uvloop rounds a timer's delay to the nearest whole millisecond (under
            # half of one: none at all), so a 400 µs deadline fired after 0.14-0.19 ms and a
            # 1.4 ms one after 1.27-1.32 ms. The rest is waited for in whole milliseconds,
            # rounded up.
            self._timer = self.connection.loop.call_later(math.ceil(left * 1e3) / 1e3, self._expire)
            return
        self._timer = None
        if not self._finished:
            self.finish(StatusCode.DEADLINE_EXCEEDED, DEADLINE_EXCEEDED)
        self.cancel()
        if not self.local_closed:  # the status waits behind data the client does not take
            self.connection.reset(self.id)

    def closed(self) -> None:
        """The server has sent the end of the stream: the deadline (or refusal) no longer
        matters. (Until then a deadline counts, also for an answer waiting on the client's
        window.)"""
        self._stop_timer()

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _release_pooled(self) -> None:
        """The pooled request's buffer goes back (its handler, which the executor answers only
        once it no longer reads the request, is over; or it never ran)."""
        pooled, self._pooled = self._pooled, None
        if pooled is not None:
            pooled.release()

    def cancel(self) -> None:
        """Nobody waits for the answer (the client reset the stream, the connection is gone,
        the deadline passed): stop the handler."""
        self._finished = True
        self._stop_timer()
        if self.task is not None:
            self.task.cancel()  # it frees the pooled request(s) when it ends
        else:
            self._release_pooled()  # no handler holds the request
            self._drop_unread()
        if self._reader is not None and not self._reader.done():
            self._reader.cancel()
        waiters, self.waiters = self.waiters, collections.deque()
        for _, waiter in waiters:
            if not waiter.done():
                waiter.cancel()

    @property
    def running(self) -> bool:
        return self.task is not None


class _Requests:
    """A streaming call's request messages as its handler iterates them."""

    __slots__ = ("_call",)

    def __init__(self, call: Call) -> None:
        self._call = call

    def __aiter__(self) -> AsyncIterator[Any]:
        return self

    async def __anext__(self) -> Any:
        call = self._call
        try:
            message = await call.read()
            if message is None:
                raise StopAsyncIteration
            assert call.method is not None  # (a call without one runs no handler)
            return _deserialized(call.method, message)
        except CallError as error:
            raise AbortError(error.code, error.message) from None


def _drop(message: StreamMessage) -> None:
    if not isinstance(message, OWN_BYTES):
        message.release()


def _deserialized(method: Method, message: StreamMessage) -> Any:
    """The handler's view of a request message: as it is for a raw method, else parsed;
    ``CallError`` for one that does not parse."""
    if method.deserialize is None:
        return message
    assert isinstance(message, OWN_BYTES)  # (messages that deserialize are not pooled)
    try:
        return method.deserialize(bytes(message))
    except Exception:  # noqa: BLE001 - the client's bytes
        raise CallError(StatusCode.INTERNAL, "Exception deserializing request!") from None


async def _compressed(payload: Payload, encoding: str) -> tuple[Payload, bool]:
    """A response message as it goes out with the call's ``encoding``: compressed (a large one
    on a thread; views from their parts, then released), or as it is when that would not make
    it smaller; and whether it was."""
    parts: list[bytes | memoryview] = payload.parts if isinstance(payload, Views) else [payload]
    try:
        if payload_size(payload) > COMPRESS_ON_LOOP_BYTES:
            # (the thread is waited for, also when cancelled: the views outlive it)
            packed = await run_in_thread(compression.grpc_compress, parts, encoding)
        else:
            packed = compression.grpc_compress(parts, encoding)
    except BaseException:
        discard(payload)
        raise
    if packed is None:
        return payload, False
    discard(payload)
    return packed, True
