"""HTTP/1.x connections parsed by httptools (llhttp, in C), serving Tornado-style delegates.

Measured under perf_analyzer at concurrency 8 with the same canned answers: Tornado's
``HTTPServer`` with a bare request callback costs 144-165 µs of CPU per request (its Python
header parsing, ``IOStream`` buffers and a coroutine per message), an httptools protocol on the
same event loop about 30 µs. So the API port is read here, and each request is handed to the
delegates Tornado would hand it to (``Routes``: the infer fast path, or the application), through
the same ``httputil.HTTPConnection`` interface (its headers as ``RequestHeaders``:
``server.http.delegates``), with Tornado's ``HTTP1Connection`` rules for
keep-alive, ``Expect: 100-continue``, chunked answers, body limits and timeouts, and malformed
requests (``400 Bad Request`` and close). Requests on one connection are served one after
another: a pipelined request waits (and reading pauses) until the answer before it is finished.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import socket
from collections.abc import Awaitable, Callable
from typing import Any, cast

import httptools
from tornado import httputil, iostream
from tornado.log import app_log, gen_log

from server.http.delegates import ConnectionDelegate
from server.http.exchange import Exchange
from server.http.headers import RequestHeaders
from server.listener import Adopter

log = logging.getLogger(__name__)

_BAD_REQUEST = b"HTTP/1.1 400 Bad Request\r\n\r\n"
#: The parser of a lost connection calls nothing back.
_NO_CALLBACKS = object()
#: Pipelined events queued beyond this many pause reading from the socket.
_QUEUE_PAUSE = 64
#: What one read takes at most while requests are parsed.
_READ_BYTES = 1 << 16
#: A body with at least this much still to come is read straight into its delegate's buffer.
DIRECT_BODY_BYTES = 1 << 16
#: How long a connection answered before its body arrived goes on reading (and dropping) what
#: the client still sends, so that the client, still sending, is not reset before it reads the
#: answer (nginx's lingering close, with its 5 s ``lingering_timeout``).
LINGER_SECS = 5.0


class _InputError(Exception):
    """A malformed or oversize request: answered 400 and the connection closed."""


class _HeadersTooLarge(Exception):
    """Headers over ``max_header_size``: the connection is closed without an answer."""


class Context:
    """What Tornado's request objects read from ``connection.context``."""

    def __init__(self, address: Any) -> None:
        self.address = address
        self.remote_ip = address[0] if isinstance(address, tuple) else "0.0.0.0"
        self.protocol = "http"

    def __str__(self) -> str:
        return str(self.remote_ip)


class HttpService:
    """The connections of one listening port and the limits they share."""

    def __init__(
        self,
        delegate: ConnectionDelegate,
        *,
        max_body_size: int,
        max_header_size: int,
        idle_timeout_secs: float,
        body_timeout_secs: float | None,
    ) -> None:
        self.delegate = delegate
        self.max_body_size = max_body_size
        self.max_header_size = max_header_size
        self.idle_timeout_secs = idle_timeout_secs
        self.body_timeout_secs = body_timeout_secs
        self.connections: set[HttpConnection] = set()
        self._adopter = Adopter("HTTP")

    def adopt(self, sock: socket.socket, address: Any) -> None:
        """Serve the accepted connection ``sock``."""
        self._adopter.adopt(sock, lambda: HttpConnection(self, address))

    async def close_all_connections(self) -> None:
        """Close every connection now, and wait until each is gone."""
        while self.connections:
            connection = next(iter(self.connections))
            connection.close()
            await connection.closed


class HttpConnection(asyncio.BufferedProtocol):
    """One client connection: its parser, its timers, and the request being served.

    Reads land in one buffer of the connection and are parsed from there, except the rest of
    a large body whose delegate gave the buffer it keeps the body in (``Exchange.receive_into``):
    then the socket is read straight into that buffer (an infer request's, in the front end's
    arena), and the parser, which has not seen those bytes, is replaced after the body."""

    def __init__(self, service: HttpService, address: Any) -> None:
        self.service = service
        self.context = Context(address)
        self.loop = asyncio.get_running_loop()
        self.closed: asyncio.Future[None] = self.loop.create_future()
        self._transport: asyncio.Transport | None = None
        self._parser = httptools.HttpRequestParser(self)
        self._read_buffer = memoryview(bytearray(_READ_BYTES))
        self._direct: Exchange | None = None  # reading the rest of its body into its buffer
        # the request line and headers being parsed
        self._url = b""
        self._fields: list[tuple[bytes, bytes]] = []
        self._field_bytes = 0  # of _fields, as they count against max_header_size
        self._header_bytes = 0
        self._reading_headers = True
        # the request being served (the first of those received), and events of the ones
        # after it, or of its own while a delegate's awaitable is pending
        self.exchange: Exchange | None = None
        self._queue: collections.deque[tuple[Callable[..., None], tuple[Any, ...]]] = (
            collections.deque()
        )
        self._waiting = False
        self._dead = False  # refused or failed: what the parser still finds is dropped
        self._paused_reading = False
        self._write_waiters: list[asyncio.Future[None]] = []
        self._idle_since: float | None = self.loop.time()
        self._idle_timer: asyncio.TimerHandle | None = None
        # when the body of the request being read must be in, and what to call if not
        self._body_deadline: float | None = None
        self._on_body_timeout: Callable[[], None] | None = None

    # --- the transport --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)
        # Writes report done only once the kernel has the bytes: an answer may be views of
        # buffers that are reused after it.
        self._transport.set_write_buffer_limits(high=0)
        self.service.connections.add(self)
        self._arm_idle_timer(self.service.idle_timeout_secs)

    def get_buffer(self, sizehint: int) -> memoryview:
        direct = self._direct
        if direct is not None:
            if direct.body_to_come():
                return direct.body_space()
            # The delegate let go of its buffer mid-body: it is closing the connection.
            self._direct = None
            self.fail()
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        direct = self._direct
        if direct is not None:
            if direct.body_filled(nbytes):
                self._direct = None
                self._parser = httptools.HttpRequestParser(self)
                self._reading_headers = True
                self._header_bytes = 0
                self._event(self._end, ())
            return
        self._parse(self._read_buffer[:nbytes])
        exchange = self.exchange
        if (
            exchange is not None
            and not self._reading_headers
            and not self._dead
            and not self._waiting
            and not self._queue
            and exchange.body_to_come() >= DIRECT_BODY_BYTES
        ):
            self._direct = exchange

    def _parse(self, data: memoryview) -> None:
        if self._dead:
            return
        if self._reading_headers:
            self._header_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            cause = exc.__context__
            if isinstance(cause, _InputError):
                self.refuse(str(cause))
            else:
                if not isinstance(cause, _HeadersTooLarge):
                    app_log.error("Uncaught exception", exc_info=cause)
                self.fail()
            return
        except httptools.HttpParserError as exc:
            self.refuse(str(exc))
            return
        if self._reading_headers and self._header_bytes > self.service.max_header_size:
            self.fail()  # as Tornado: closed without an answer
        elif self._queue and not self._paused_reading and len(self._queue) > _QUEUE_PAUSE:
            self._paused_reading = True
            assert self._transport is not None
            self._transport.pause_reading()

    def pause_writing(self) -> None:
        pass  # each write's future waits until resume_writing (see write)

    def resume_writing(self) -> None:
        waiters, self._write_waiters = self._write_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def write(self, data: bytes | memoryview) -> asyncio.Future[None]:
        """Write ``data``; the future is done when the kernel has taken all of it."""
        future: asyncio.Future[None] = self.loop.create_future()
        transport = self._transport
        if transport is None or transport.is_closing():
            future.set_exception(iostream.StreamClosedError())
            future.exception()  # retrieved: a caller that ignores it is not warned
            return future
        transport.write(data)
        if transport.get_write_buffer_size():
            self._write_waiters.append(future)
        else:
            future.set_result(None)
        return future

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def closing(self) -> bool:
        return self._transport is None or self._transport.is_closing()

    def connection_lost(self, exc: Exception | None) -> None:
        self.service.connections.discard(self)
        # What refers back to this connection goes (the parser's callbacks, the transport, the
        # idle timer), so that it is freed now, with its read buffer, not by a collection.
        self._transport = None
        self._parser = httptools.HttpRequestParser(_NO_CALLBACKS)
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        self.stop_body_clock()
        self._queue.clear()
        for waiter in self._write_waiters:
            if not waiter.done():
                waiter.set_exception(iostream.StreamClosedError())
                waiter.exception()
        self._write_waiters = []
        exchange, self.exchange = self.exchange, None
        self._direct = None
        if exchange is not None:
            exchange.connection_lost()
            exchange.release()
        self.service.delegate.on_close(self)
        if not self.closed.done():
            self.closed.set_result(None)

    def fail(self) -> None:
        """Close the connection, dropping whatever else it sends."""
        self._dead = True
        self.close()

    def _linger(self) -> None:
        """End a connection answered while its request's body is still coming: the answer
        is followed by a FIN, what arrives afterwards is dropped, and the socket is closed once
        the client closes its side or after ``LINGER_SECS``. Closing at once would leave the
        unread bytes in the kernel, which then resets the connection, and a client that sends
        its whole body before it reads (``http.client``, tritonclient) sees a broken pipe
        instead of the answer."""
        transport = self._transport
        self._dead = True
        if transport is None or transport.is_closing() or not transport.can_write_eof():
            self.close()
            return
        transport.write_eof()
        if self._paused_reading:
            self._paused_reading = False
            transport.resume_reading()
        if self._idle_timer is not None:
            self._idle_timer.cancel()
        self._idle_timer = self.loop.call_later(LINGER_SECS, self.close)

    def refuse(self, reason: str) -> None:
        """Tornado's answer to a malformed request: logged, 400 (unless an answer has been
        started), the connection closed."""
        gen_log.info("Malformed HTTP message from %s: %s", self.context, reason)
        exchange = self.exchange
        answered = exchange is not None and exchange.headers_written
        if self._transport is not None and not self._transport.is_closing() and not answered:
            self._transport.write(_BAD_REQUEST)
        self.fail()

    # --- idle connections and slow bodies -------------------------------------------------

    def start_body_clock(self, timeout: float, on_timeout: Callable[[], None]) -> None:
        """Call ``on_timeout``, which ends the connection, unless ``stop_body_clock`` is called
        within ``timeout`` seconds (the body of the request being read has arrived). It
        shares the connection's idle timer, which is moved only when it would fire too late:
        none is set per request (a timer set and cancelled per request cost 2-3% of a front
        end's CPU under load)."""
        deadline = self.loop.time() + timeout
        self._body_deadline = deadline
        self._on_body_timeout = on_timeout
        timer = self._idle_timer
        if timer is None or timer.when() > deadline:
            if timer is not None:
                timer.cancel()
            self._arm_idle_timer(timeout)

    def stop_body_clock(self) -> None:
        self._body_deadline = None
        self._on_body_timeout = None

    def _arm_idle_timer(self, delay: float) -> None:
        self._idle_timer = self.loop.call_later(delay, self._check_deadlines)

    def _check_deadlines(self) -> None:
        """Close a connection that has waited for a request's headers longer than the idle
        timeout; time out a body that has not arrived by its deadline. One timer per
        connection, re-armed lazily for the nearer of the two."""
        timeout = self.service.idle_timeout_secs
        since = self._idle_since
        now = self.loop.time()
        if since is not None and now - since >= timeout:
            self._idle_timer = None
            self.close()
            return
        deadline = self._body_deadline
        if deadline is not None and now >= deadline:
            on_timeout = self._on_body_timeout
            self.stop_body_clock()
            self._idle_timer = None
            if on_timeout is not None:
                on_timeout()  # (it ends the connection: no timer is needed any more)
            return
        delay = timeout if since is None else since + timeout - now
        self._arm_idle_timer(delay if deadline is None else min(delay, deadline - now))

    # --- the parser's callbacks -----------------------------------------------------------

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._fields.append((name, value))
        self._field_bytes += len(name) + len(value) + 4

    def on_headers_complete(self) -> None:
        if len(self._url) + self._field_bytes > self.service.max_header_size:
            raise _HeadersTooLarge()
        self._reading_headers = False
        self._idle_since = None
        parser = self._parser
        version = parser.get_http_version()
        if not version.startswith("1."):
            raise _InputError(f"Unexpected HTTP version 'HTTP/{version}'")
        start_line = httputil.RequestStartLine(
            parser.get_method().decode("latin1"), self._url.decode("latin1"), "HTTP/" + version
        )
        headers = RequestHeaders(self._fields)
        self._url = b""
        self._fields = []
        self._field_bytes = 0
        self._event(self._begin, (start_line, headers))

    def on_body(self, body: bytes) -> None:
        self._event(self._body, (body,))

    def on_message_complete(self) -> None:
        self._reading_headers = True
        self._header_bytes = 0
        self._event(self._end, ())

    # --- serving the requests in order ----------------------------------------------------

    def _event(self, handler: Callable[..., None], args: tuple[Any, ...]) -> None:
        if self._dead:
            return
        if self._waiting or self._queue:
            self._queue.append((handler, args))
        else:
            handler(*args)

    def _proceed(self) -> None:
        """Run queued events until one has to wait again."""
        queue = self._queue
        while queue and not self._waiting and not self._dead:
            handler, args = queue.popleft()
            handler(*args)
        if not queue and self._paused_reading and self._transport is not None:
            self._paused_reading = False
            self._transport.resume_reading()

    def _wait_for(self, awaitable: Awaitable[None] | None, then: Callable[[], None]) -> None:
        """Run ``then`` once the delegate's ``awaitable`` is done (at once without one); the
        events after it wait meanwhile."""
        if awaitable is None:
            then()
            return
        self._waiting = True
        future = asyncio.ensure_future(awaitable)

        def done(future: asyncio.Future[None]) -> None:
            if self._dead or self.exchange is None:
                return  # closed, or answered (and closing) meanwhile
            if not future.cancelled() and future.exception() is not None:
                app_log.error("Uncaught exception", exc_info=future.exception())
                self.fail()
                return
            self._waiting = False
            then()
            if not self._waiting:
                self._proceed()

        future.add_done_callback(done)

    def _begin(self, start_line: httputil.RequestStartLine, headers: RequestHeaders) -> None:
        exchange = Exchange(self, start_line, headers)
        self.exchange = exchange
        exchange.delegate = self.service.delegate.start_request(self, exchange)
        delivered = exchange.call(exchange.delegate.headers_received, start_line, headers)
        self._wait_for(delivered, exchange.headers_delivered)

    def _body(self, chunk: bytes) -> None:
        exchange = self.exchange
        if exchange is not None:
            self._wait_for(exchange.body(chunk), _nothing)

    def _end(self) -> None:
        exchange = self.exchange
        if exchange is None:
            return
        exchange.read_done()
        if self.exchange is exchange:  # not finished yet: what comes next waits for it
            self._waiting = True

    def exchange_done(self, exchange: Exchange) -> None:
        """``exchange``'s answer is written: close, or serve the next request."""
        if self.exchange is not exchange:
            return
        self.exchange = None
        self._direct = None
        exchange.release()
        if exchange.disconnect_on_finish:
            if exchange.read_finished:
                self.close()
            else:
                self._linger()
            return
        self._idle_since = self.loop.time()
        if self._waiting:
            self._waiting = False
            self._proceed()


def _nothing() -> None:
    pass
