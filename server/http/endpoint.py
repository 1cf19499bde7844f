"""An HTTP endpoint: the connections' service and the listener accepting them; the inference
API's is built here for the one-process server and for each front end."""

from __future__ import annotations

import logging
import socket

from tornado.netutil import bind_sockets

from server.http.connection import HttpService
from server.http.delegates import ConnectionDelegate
from server.http.server import Routes
from server.listener import Listener
from server.memory.host_pool import BufferSource
from server.plane import Plane
from server.settings import HTTP_CHUNK_BYTES, Settings

log = logging.getLogger("server")
#: Tornado's default: how long a connection may wait for a request's headers.
DEFAULT_IDLE_TIMEOUT_SECS = 3600


class Http:
    """An HTTP service and the listener that accepts its connections."""

    def __init__(
        self,
        server: HttpService,
        address: str,
        port: int,
        name: str,
        sockets: list[socket.socket] | None = None,
    ) -> None:
        """Listens on ``address:port``, or on ``sockets`` already listening (a front end's,
        which the supervisor bound and announces)."""
        self.server = server
        self.listener = Listener(server, sockets or bind_sockets(port, address), name)
        if sockets is None:
            log.info("Started %s at %s:%d", name, address, self.listener.port)


def service(
    delegate: ConnectionDelegate,
    max_body_size: int = 100 << 20,
    max_header_size: int = 65536,
    idle_timeout_secs: float = DEFAULT_IDLE_TIMEOUT_SECS,
    body_timeout_secs: float | None = None,
) -> HttpService:
    """Connections served with Tornado's defaults unless told otherwise (a Tornado
    ``Application`` as ``delegates.TornadoDelegate(app)``)."""
    return HttpService(
        delegate, max_body_size=max_body_size, max_header_size=max_header_size,
        idle_timeout_secs=idle_timeout_secs or DEFAULT_IDLE_TIMEOUT_SECS,
        body_timeout_secs=body_timeout_secs,
    )


def start_http(
    settings: Settings,
    dataplane: Plane,
    pool: BufferSource,
    sockets: list[socket.socket] | None = None,
) -> Http:
    server = service(
        Routes(dataplane, settings, pool),
        # Slack above the limit so that our own check, which answers 400, runs before the
        # connection's, which answers a bare 400 and closes (chunked bodies).
        max_body_size=settings.http_max_input_size + HTTP_CHUNK_BYTES,
        max_header_size=settings.http_max_header_size,
        idle_timeout_secs=settings.http_idle_timeout_secs,
        body_timeout_secs=settings.http_body_timeout_secs,
    )
    return Http(server, settings.http_address, settings.http_port, "HTTPService", sockets)
