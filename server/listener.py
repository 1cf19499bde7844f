"""Accepts connections for a service (HTTP's or gRPC's), pausing instead of spinning when
accept fails.

An accept handler that lets every error but EAGAIN escape to asyncio (as Tornado's did) has it
logged with a traceback; the listening socket stays readable, so with the process out of file
descriptors that repeated on every loop iteration (10 MB of log in 3 s, two thirds of a core). Here a failed accept
(EMFILE, ENFILE, ENOBUFS, ENOMEM, or any other) stops watching that socket for ``PAUSE_SECS``
and is logged at most once per interval; the connections meanwhile wait in the kernel's
backlog, and are accepted as soon as descriptors are free again.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Sequence
from ssl import SSLContext
from typing import Any, Protocol

from server.logs import RepeatingError

log = logging.getLogger(__name__)

#: How long a socket whose accept failed is left alone before the next try.
PAUSE_SECS = 0.1
# At most this many accepts per wake-up, so that other work gets the loop (as Tornado does).
_ACCEPTS_PER_WAKEUP = 128


class Service(Protocol):
    """What serves the accepted connections."""

    def adopt(self, sock: socket.socket, address: Any) -> None: ...


class Adopter:
    """Hands accepted sockets to the event loop with a protocol of their service's, keeping
    the tasks that set them up until they are done (a failed TLS handshake is logged)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._tasks: set[asyncio.Task[Any]] = set()

    def adopt(
        self,
        sock: socket.socket,
        protocol: Callable[[], asyncio.BaseProtocol],
        ssl: SSLContext | None = None,
    ) -> None:
        """Serve ``sock`` with ``protocol()`` (TCP_NODELAY set on TCP: answers go out as
        written)."""
        sock.setblocking(False)
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        loop = asyncio.get_running_loop()
        task = loop.create_task(loop.connect_accepted_socket(protocol, sock, ssl=ssl))
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.info("a %s connection could not be served: %s", self._name, task.exception())


class Listener:
    """Feeds the connections arriving on ``sockets`` to ``service`` until closed."""

    def __init__(self, service: Service, sockets: Sequence[socket.socket], name: str) -> None:
        self._service = service
        self._sockets = list(sockets)
        self._loop = asyncio.get_running_loop()
        self._failures = RepeatingError(log, f"{name}: accepting a connection failed")
        self._retries: dict[socket.socket, asyncio.TimerHandle] = {}
        for sock in self._sockets:
            self._watch(sock)

    @property
    def port(self) -> int:
        port: int = self._sockets[0].getsockname()[1]
        return port

    def _watch(self, sock: socket.socket) -> None:
        self._retries.pop(sock, None)
        self._loop.add_reader(sock, self._accept, sock)

    def _accept(self, sock: socket.socket) -> None:
        for _ in range(_ACCEPTS_PER_WAKEUP):
            try:
                connection, address = sock.accept()
            except BlockingIOError:  # every waiting connection taken
                return
            except ConnectionAbortedError:  # gone while in the backlog
                continue
            except OSError as exc:
                self._failures.report(exc)
                self._loop.remove_reader(sock)
                self._retries[sock] = self._loop.call_later(PAUSE_SECS, self._watch, sock)
                return
            self._service.adopt(connection, address)

    def close(self) -> None:
        """Stop accepting and close the sockets; connections already accepted stay open."""
        for retry in self._retries.values():
            retry.cancel()
        self._retries.clear()
        for sock in self._sockets:
            self._loop.remove_reader(sock)
            sock.close()
