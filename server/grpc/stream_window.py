"""Backpressure for one ``ModelStreamInfer`` stream: a client that stops reading its replies
stops the server reading its requests, so what the stream holds in server memory is bounded.

A generator handler's step past its ``yield`` comes only once HTTP/2 flow control has taken the
whole reply (``server.grpc.call.Call.send``), that is once the peer's window had room for its
last byte. Until then a reply waits in server memory, as do the replies
queued behind it and the requests still running. A stream therefore counts, from the moment it
reads a request until that request's reply has been taken, the bytes of the request (until it
is answered) and then of its reply; and it counts the requests running. Past either bound it
reads no further request until replies drain. Its client's unsent requests then wait on the
client's side, held back by the stream's receive window, which the server stops extending
while nobody reads (``server.grpc.connection``). Other streams and calls have their own windows and are unaffected.
"""

from __future__ import annotations

import asyncio

#: Bytes of requests and unsent replies one stream may hold before it stops reading requests.
#: A request of any size (up to the 2 GiB message limit) is read while the stream holds less, so
#: the last request read may pass the bound, as may replies larger than their requests (those of
#: at most ``MAX_RUNNING`` requests).
MAX_HELD_BYTES = 64 * 2**20
#: Requests of one stream that run at once; the next is read when one of them is answered. Room
#: for a dynamic batch of this size from one stream; it also bounds what running requests hold
#: before their replies' sizes are known (a small request may have a large reply).
MAX_RUNNING = 32


class StreamWindow:
    """What one stream holds: requests read and not answered, replies made and not sent."""

    def __init__(self, max_bytes: int = MAX_HELD_BYTES, max_running: int = MAX_RUNNING) -> None:
        self._max_bytes = max_bytes
        self._max_running = max_running
        self._bytes = 0
        self._running = 0
        self._changed = asyncio.Event()

    async def room(self) -> None:
        """Return once the stream may read another request."""
        while self._bytes >= self._max_bytes or self._running >= self._max_running:
            self._changed.clear()
            await self._changed.wait()

    def read(self, request_bytes: int) -> None:
        """A request of ``request_bytes`` was read and starts running."""
        self._running += 1
        self._bytes += request_bytes

    def answered(self, request_bytes: int, reply_bytes: int) -> None:
        """A request was answered: its bytes are let go of, its reply's wait to be sent."""
        self._running -= 1
        self._bytes += reply_bytes - request_bytes
        self._changed.set()

    def replied(self, reply_bytes: int) -> None:
        """A reply of ``reply_bytes`` waits to be sent, its request still running (one of a
        decoupled model's responses)."""
        self._bytes += reply_bytes

    def sent(self, reply_bytes: int) -> None:
        """HTTP/2 flow control took a reply of ``reply_bytes``."""
        self._bytes -= reply_bytes
        self._changed.set()
