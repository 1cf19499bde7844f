"""The HTTP/REST application: routes as Triton's regexes (triton-facts §1.1).

``POST .../infer`` is served by ``InferExchange`` directly on the connection
(``server.http.connection``); every other request goes to the Tornado application, unchanged.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import cast

import tornado.web
from tornado import httputil

from server import restricted
from server.errors import InferenceServerError
from server.http import categories
from server.http.base import BaseHandler, NotFoundHandler, RefusedHandler
from server.http.delegates import RequestDelegate, TornadoRequest
from server.http.exchange import Exchange
from server.http.headers import RequestHeaders
from server.http.infer import INFER_PATH, MODEL_PATH, InferExchange, InferService
from server.http.logging_settings import LoggingHandler
from server.http.metadata import (
    LiveHandler,
    ModelConfigHandler,
    ModelMetadataHandler,
    ModelReadyHandler,
    ReadyHandler,
    ServerMetadataHandler,
)
from server.http.repository import (
    RepositoryIndexHandler,
    RepositoryLoadHandler,
    StatisticsHandler,
)
from server.http.shared_memory import SharedMemoryHandler
from server.http.trace_settings import TraceSettingHandler
from server.memory.host_pool import BufferSource
from server.plane import Plane
from server.settings import Settings

_MODEL = MODEL_PATH
_SHARED_MEMORY = (
    r"/v2/(systemsharedmemory|cudasharedmemory)(?:/region/([^/]+))?/(status|register|unregister)"
)


@tornado.web.stream_request_body
class InferMethodNotAllowed(BaseHandler):
    """The infer route's other methods: 405, as JSON (``POST`` never reaches the application).
    Streamed, as the route's requests always were: an unread body is not read, the connection
    closes after the answer."""

    SUPPORTED_METHODS = ()


def make_app(dataplane: Plane, settings: Settings) -> tornado.web.Application:
    """Build the Tornado application; unknown paths are 404 and wrong methods 405, as JSON."""
    common = {"dataplane": dataplane, "settings": settings}
    return tornado.web.Application(
        [
            (r"/v2/health/live", LiveHandler, common),
            (r"/v2/health/ready", ReadyHandler, common),
            (r"/v2", ServerMetadataHandler, common),
            (r"/v2/repository(?:/[^/]+)?/index", RepositoryIndexHandler, common),
            (r"/v2/repository(?:/[^/]+)?/models/([^/]+)/(load|unload)", RepositoryLoadHandler, common),
            (r"/v2/models/stats", StatisticsHandler, common),
            (r"/v2/logging", LoggingHandler, common),
            (r"/v2/trace/setting", TraceSettingHandler, common),
            (r"/v2/models/([^/]+)/trace/setting", TraceSettingHandler, common),
            (_SHARED_MEMORY, SharedMemoryHandler, common),
            (_MODEL + r"/stats", StatisticsHandler, common),
            (_MODEL + r"/ready", ModelReadyHandler, common),
            (_MODEL + r"/config", ModelConfigHandler, common),
            (MODEL_PATH + "/infer", InferMethodNotAllowed, common),
            (_MODEL, ModelMetadataHandler, common),
        ],
        default_handler_class=NotFoundHandler,
        default_handler_args=common,
        compress_response=False,
    )


class Routes:
    """What the API port serves (a ``ConnectionDelegate``): infer requests through
    ``InferExchange``, the rest through the application."""

    def __init__(self, dataplane: Plane, settings: Settings, pool: BufferSource) -> None:
        self.app = make_app(dataplane, settings)
        self.infer = InferService(dataplane, settings, pool)
        self.restrictions = restricted.for_http(settings.http_restricted_apis)
        self._refused_args = {"dataplane": dataplane, "settings": settings}

    def refused(
        self,
        server_conn: object,
        conn: Exchange,
        start_line: httputil.RequestStartLine,
        headers: httputil.HTTPHeaders,
        error: InferenceServerError,
    ) -> httputil.HTTPMessageDelegate:
        """The delegate answering a request, whatever its route and method, with ``error``."""
        request = httputil.HTTPServerRequest(
            connection=conn, server_connection=server_conn, start_line=start_line,
            headers=headers,
        )
        return self.app.get_handler_delegate(
            request, RefusedHandler, {**self._refused_args, "error": error}
        )

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> RequestDelegate:
        return _Dispatch(self, server_conn, cast(Exchange, request_conn))

    def on_close(self, server_conn: object) -> None:
        self.app.on_close(server_conn)


class _Dispatch:
    """Picks the delegate for one request once its start line is known, then forwards to it."""

    def __init__(self, routes: Routes, server_conn: object, conn: Exchange) -> None:
        self._routes = routes
        self._server_conn = server_conn
        self._conn = conn
        self._delegate: RequestDelegate | None = None

    def headers_received(
        self, start_line: httputil.RequestStartLine, headers: RequestHeaders
    ) -> Awaitable[None] | None:
        routes = self._routes
        target = start_line.path.partition("?")[0]
        # Restricted APIs are refused before anything else is looked at (as Triton does),
        # their method included.
        refusal = (
            routes.restrictions.refusal(categories.category(target), headers.get)
            if routes.restrictions
            else None
        )
        path = INFER_PATH.match(target)
        if path is not None and start_line.method == "POST":
            self._delegate = InferExchange(routes.infer, self._conn, path, refusal)
        elif refusal is not None:
            self._delegate = TornadoRequest(routes.refused(
                self._server_conn, self._conn, start_line, headers.tornado(), refusal
            ))
        else:
            self._delegate = TornadoRequest(routes.app.start_request(self._server_conn, self._conn))
        return self._delegate.headers_received(start_line, headers)

    def data_received(self, chunk: bytes) -> Awaitable[None] | None:
        assert self._delegate is not None
        return self._delegate.data_received(chunk)

    def finish(self) -> None:
        assert self._delegate is not None
        self._delegate.finish()

    def on_connection_close(self) -> None:
        if self._delegate is not None:
            self._delegate.on_connection_close()
