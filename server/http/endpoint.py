"""An HTTP endpoint: a Tornado server and the listener accepting its connections; the
inference API's is built here for the one-process server and for each front end."""

from __future__ import annotations

import logging
import socket

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from server.http.listener import Listener
from server.http.server import Routes
from server.memory.host_pool import BufferSource
from server.plane import Plane
from server.settings import HTTP_CHUNK_BYTES, Settings

log = logging.getLogger("server")



class Http:
    """A Tornado HTTP server and the listener that accepts its connections."""

    def __init__(
        self,
        server: HTTPServer,
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


def start_http(
    settings: Settings,
    dataplane: Plane,
    pool: BufferSource,
    sockets: list[socket.socket] | None = None,
) -> Http:
    server = HTTPServer(
        Routes(dataplane, settings, pool),
        # Slack above the limit so that our own check, which answers 400, runs before
        # Tornado's, which just drops the connection (chunked bodies).
        max_body_size=settings.http_max_input_size + HTTP_CHUNK_BYTES,
        chunk_size=HTTP_CHUNK_BYTES,  # Tornado allocates (and zeroes) this much per read
        max_header_size=settings.http_max_header_size,
        idle_connection_timeout=settings.http_idle_timeout_secs,
        body_timeout=settings.http_body_timeout_secs,
    )
    return Http(server, settings.http_address, settings.http_port, "HTTPService", sockets)
