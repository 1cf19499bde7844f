"""What the connections of ``server.http.connection`` hand requests to.

Tornado's delegate interface, with the request's headers as ``RequestHeaders`` (cheaper to
build and read: ``server.http.headers``). ``Routes`` and the infer path take them as they are.
Tornado's own delegates get Tornado's ``HTTPHeaders`` of the same fields: an ``Application``
serving a port (the metrics port) through ``TornadoDelegate``, and the application behind
``Routes``, for its routes, through ``TornadoRequest``.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Protocol

from tornado import httputil

from server.http.headers import RequestHeaders


class RequestDelegate(Protocol):
    """One request's delegate (``httputil.HTTPMessageDelegate`` with ``RequestHeaders``)."""

    def headers_received(
        self, start_line: httputil.RequestStartLine, headers: RequestHeaders
    ) -> Awaitable[None] | None: ...

    def data_received(self, chunk: bytes) -> Awaitable[None] | None: ...

    def finish(self) -> None: ...

    def on_connection_close(self) -> None: ...


class ConnectionDelegate(Protocol):
    """What a port serves (``httputil.HTTPServerConnectionDelegate`` with ``RequestDelegate``)."""

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> RequestDelegate: ...

    def on_close(self, server_conn: object) -> None: ...


class TornadoDelegate:
    """A Tornado delegate served as a ``ConnectionDelegate``."""

    def __init__(self, delegate: httputil.HTTPServerConnectionDelegate) -> None:
        self._delegate = delegate

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> RequestDelegate:
        return TornadoRequest(self._delegate.start_request(server_conn, request_conn))

    def on_close(self, server_conn: object) -> None:
        self._delegate.on_close(server_conn)


class TornadoRequest:
    """A Tornado request delegate served as a ``RequestDelegate``."""

    def __init__(self, delegate: httputil.HTTPMessageDelegate) -> None:
        self._delegate = delegate

    def headers_received(
        self, start_line: httputil.RequestStartLine, headers: RequestHeaders
    ) -> Awaitable[None] | None:
        return self._delegate.headers_received(start_line, headers.tornado())

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        return self._delegate.data_received(chunk)

    def finish(self) -> None:
        self._delegate.finish()

    def on_connection_close(self) -> None:
        self._delegate.on_connection_close()
