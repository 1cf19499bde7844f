"""One request on an HTTP/1.x connection and its answer: the ``request_conn`` that Tornado's
delegates are given and write to, with the rules of Tornado's ``HTTP1Connection`` (its
``write_headers``, ``finish``, keep-alive decision, body limit and body timeout)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Protocol

from tornado import httputil
from tornado.log import app_log, gen_log

from server.http.headers import RequestHeaders

if TYPE_CHECKING:
    from server.http.connection import HttpConnection
    from server.http.delegates import RequestDelegate

_CR_OR_LF = re.compile(b"\r|\n")
_CONTINUE = b"HTTP/1.1 100 (Continue)\r\n\r\n"


class BodySink(Protocol):
    """A delegate's buffer for a body of known length, filled in place."""

    def space(self) -> memoryview:
        """The part of the buffer the body's next bytes go to (not empty until it is full)."""

    def filled(self, nbytes: int) -> None:
        """``nbytes`` more bytes of the body were written at the start of ``space()``."""


class Exchange(httputil.HTTPConnection):
    """One request and its answer: the ``request_conn`` Tornado's delegates write to, with
    ``HTTP1Connection``'s rules."""

    def __init__(
        self,
        connection: HttpConnection,
        start_line: httputil.RequestStartLine,
        headers: RequestHeaders,
    ) -> None:
        self.connection = connection
        self.loop = connection.loop
        self.context = connection.context
        self.delegate: RequestDelegate | None = None
        self._start_line = start_line
        self._headers = headers
        service = connection.service
        self.max_body_size = service.max_body_size
        self._received = 0
        self._length: int | None = None  # Content-Length, once the headers are delivered
        self._sink: BodySink | None = None
        self.disconnect_on_finish = not _can_keep_alive(start_line, headers)
        self.read_finished = False
        self.write_finished = False
        self.headers_written = False
        self._chunking = False
        self._remaining: int | None = None
        self._close_callback: Callable[[], None] | None = None
        self._last_write: asyncio.Future[None] | None = None

    # --- what the connection tells it -----------------------------------------------------

    def call(self, method: Callable[..., Awaitable[None] | None], *args: Any) -> Awaitable[None] | None:
        """A delegate method; one that raises is logged and ends the connection (as Tornado)."""
        try:
            return method(*args)
        except Exception:  # noqa: BLE001 - Tornado's _ExceptionLoggingContext
            app_log.error("Uncaught exception", exc_info=True)
            self.fail()
            return None

    def fail(self) -> None:
        self.connection.fail()

    def headers_delivered(self) -> None:
        if self.connection.exchange is not self:
            return  # answered already, and closing (the body was not read)
        headers = self._headers
        if headers.get("Expect") == "100-continue" and not self.write_finished:
            self.connection.write(_CONTINUE)
        length = headers.get("Content-Length")
        if length is not None:
            try:
                size = int(length)
            except ValueError:
                size = -1
            if size < 0:
                self._input_error(f"Only integer Content-Length is allowed: {length}")
                return
            if size > self.max_body_size:
                self._input_error("Content-Length too long")
                return
            self._length = size
        timeout = self.connection.service.body_timeout_secs
        if timeout is not None and (length not in (None, "0") or "Transfer-Encoding" in headers):
            self.connection.start_body_clock(timeout, self._body_timed_out)

    def body(self, chunk: bytes) -> Awaitable[None] | None:
        self._received += len(chunk)
        if self._received > self.max_body_size:
            self._input_error("chunked body too large")
            return None
        if self.write_finished or self.delegate is None:
            return None  # answered already: the rest of the body is dropped
        return self.call(self.delegate.data_received, chunk)

    def receive_into(self, sink: BodySink | None) -> None:
        """The delegate keeps this request's body in ``sink`` (None: no longer): what is left of
        a large body is then read into it directly, without ``data_received`` calls."""
        self._sink = sink

    def body_to_come(self) -> int:
        """Bytes of the body still to be read straight into the sink (0: none, or no sink)."""
        if self._sink is None or self._length is None or self.write_finished:
            return 0
        return self._length - self._received

    def body_space(self) -> memoryview:
        assert self._sink is not None and self._length is not None
        return self._sink.space()[: self._length - self._received]

    def body_filled(self, nbytes: int) -> bool:
        """``nbytes`` were read into ``body_space()``; whether the body is complete."""
        assert self._sink is not None and self._length is not None
        self._received += nbytes
        self._sink.filled(nbytes)
        return self._received >= self._length

    def read_done(self) -> None:
        self.connection.stop_body_clock()
        self.read_finished = True
        if not self.write_finished and self.delegate is not None:
            self.call(self.delegate.finish)

    def connection_lost(self) -> None:
        self.connection.stop_body_clock()
        if self.write_finished:
            return
        if not self.read_finished:
            if self.delegate is not None:
                self.call(self.delegate.on_connection_close)
        elif self._close_callback is not None:
            callback, self._close_callback = self._close_callback, None
            callback()

    def release(self) -> None:
        """Forget the delegate and the close callback once the answer is written (or the
        client gone): they refer back to this exchange, and the cycle left each request's
        objects (17 of them, its task and coroutine included) to the garbage collector."""
        self.delegate = None
        self._close_callback = None
        self._sink = None

    def _body_timed_out(self) -> None:
        gen_log.info("Timeout reading body from %s", self.context)
        self.connection.fail()

    def _input_error(self, reason: str) -> None:
        self.connection.stop_body_clock()
        self.connection.refuse(reason)

    # --- httputil.HTTPConnection ----------------------------------------------------------

    def set_close_callback(self, callback: Callable[[], None] | None) -> None:
        self._close_callback = callback

    def set_max_body_size(self, max_body_size: int) -> None:
        self.max_body_size = max_body_size

    def close(self) -> None:
        self.connection.close()

    def write_headers(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
        chunk: bytes | None = None,
    ) -> asyncio.Future[None]:
        assert isinstance(start_line, httputil.ResponseStartLine)
        request = self._start_line
        code = start_line.code
        self._chunking = (
            request.version == "HTTP/1.1"
            and request.method != "HEAD"
            and code not in (204, 304)
            and not 100 <= code < 200
            and "Content-Length" not in headers
        )
        if request.version == "HTTP/1.1" and self.disconnect_on_finish:
            headers["Connection"] = "close"
        if (
            request.version == "HTTP/1.0"
            and self._headers.get("Connection", "").lower() == "keep-alive"
        ):
            headers["Connection"] = "Keep-Alive"
        if self._chunking:
            headers["Transfer-Encoding"] = "chunked"
        if request.method == "HEAD" or code == 304:
            self._remaining = 0
        elif "Content-Length" in headers:
            self._remaining = int(headers["Content-Length"])
        else:
            self._remaining = None
        lines = [f"HTTP/1.1 {code} {start_line.reason}".encode("latin1")]
        lines.extend(f"{name}: {value}".encode("latin1") for name, value in headers.get_all())
        for line in lines:
            if _CR_OR_LF.search(line):
                raise ValueError(f"Illegal characters (CR or LF) in header: {line!r}")
        self.headers_written = True
        data = b"\r\n".join(lines) + b"\r\n\r\n"
        if chunk:
            data += self._format_chunk(chunk)
        return self._write(data)

    def write_answer(
        self, code: int, reason: str, fields: list[tuple[str, str]], body: bytes
    ) -> asyncio.Future[None]:
        """A whole answer to a POST with a ``Content-Length``, as ``write_headers`` would write
        it with ``fields`` and ``body``, without building ``HTTPHeaders``: for fields that are
        ours (the infer path's), so not checked for line breaks."""
        lines = [f"HTTP/1.1 {code} {reason}"]
        lines.extend(f"{name}: {value}" for name, value in fields)
        lines.append(f"Content-Length: {len(body)}")
        request = self._start_line
        if request.version == "HTTP/1.1":
            if self.disconnect_on_finish:
                lines.append("Connection: close")
        elif self._headers.get("Connection", "").lower() == "keep-alive":
            lines.append("Connection: Keep-Alive")
        self._chunking = False
        self._remaining = 0
        self.headers_written = True
        lines.append("\r\n")
        head = "\r\n".join(lines).encode("latin1")
        return self._write(head + body)

    def write(self, chunk: bytes | memoryview) -> asyncio.Future[None]:
        return self._write(self._format_chunk(chunk))

    def _write(self, data: bytes | memoryview) -> asyncio.Future[None]:
        future = self.connection.write(data)
        self._last_write = future
        return future

    def _format_chunk(self, chunk: bytes | memoryview) -> bytes | memoryview:
        if self._remaining is not None:
            self._remaining -= len(chunk)
            if self._remaining < 0:
                self.connection.close()
                raise httputil.HTTPOutputError("Tried to write more data than Content-Length")
        if self._chunking and chunk:
            return b"%x\r\n" % len(chunk) + bytes(chunk) + b"\r\n"
        return chunk

    def finish(self) -> None:
        if self._remaining and not self._closed():
            self.connection.close()
            raise httputil.HTTPOutputError(
                f"Tried to write {self._remaining} bytes less than Content-Length"
            )
        if self._chunking and not self._closed():
            self._write(b"0\r\n\r\n")
        self.write_finished = True
        self._close_callback = None
        if not self.read_finished:
            # Answered while the body is still coming: closing is the only way not to read it.
            self.disconnect_on_finish = True
        last = self._last_write
        if last is None or last.done():
            self.connection.exchange_done(self)
        else:
            last.add_done_callback(lambda _: self.connection.exchange_done(self))

    def _closed(self) -> bool:
        return self.connection.closing()


def _can_keep_alive(start_line: httputil.RequestStartLine, headers: RequestHeaders) -> bool:
    """Tornado's rule (``HTTP1Connection._can_keep_alive``)."""
    connection = headers.get("Connection")
    if connection is not None:
        connection = connection.lower()
    if start_line.version == "HTTP/1.1":
        return connection != "close"
    if (
        "Content-Length" in headers
        or "Transfer-Encoding" in headers
        or start_line.method in ("HEAD", "GET")
    ):
        return connection == "keep-alive"
    return False
