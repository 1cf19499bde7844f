"""Counts the requests in flight, and stops letting new ones in when asked to.

Graceful shutdown: the server's gate closes (new requests get 503 / UNAVAILABLE, readiness
turns false), then the server waits until the requests already inside have been answered.
Each model version has a gate too, closed when the version is unloaded or replaced.
"""

from __future__ import annotations

import asyncio

from server.errors import Unavailable

STOPPING = (
    "Server is stopping, scheduler for model has stopped accepting new inference requests"
)


class RequestGate:
    """A counter of admitted requests with a switch to refuse new ones."""

    def __init__(self, closed_message: str = STOPPING) -> None:
        self._closed_message = closed_message
        self._inside = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def inside(self) -> int:
        return self._inside

    def admit(self) -> RequestGate:
        """``with gate.admit():`` holds one place while the request is served; refused once
        the gate is closed. (The gate is its own context manager: a generator-based one cost
        six calls per request.)"""
        return self

    def __enter__(self) -> None:
        if self._closed:
            raise Unavailable(self._closed_message)
        if self._inside == 0:
            self._idle.clear()
        self._inside += 1

    def __exit__(self, *exc_info: object) -> None:
        self._inside -= 1
        if self._inside == 0:
            self._idle.set()

    def close(self) -> None:
        self._closed = True

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no request is inside; False if ``timeout`` seconds passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
        except TimeoutError:
            return False
        return True
