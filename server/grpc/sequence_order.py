"""Requests of one sequence on one ``ModelStreamInfer`` stream run in the order they were read.

A stream's requests are handled concurrently, and the way from the socket to the scheduler
has awaits (a model spec fetched from the executor, a large message decoded off the loop)
that can let a later request overtake an earlier one. For a sequence that would be an error
(its second request arriving before its START), so each request that names a sequence waits
until the stream's previous request of the same model and sequence has been answered, as
Triton's stream handler, which enqueues a stream's requests one by one in arrival order. The
sequence batcher runs one request of a sequence at a time anyway: nothing is lost by waiting.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from server.generated import grpc_service_pb2 as pb
from server.protocol.grpc_codec import parameter_value

_Key = tuple[str, int | str]


class SequenceOrder:
    """One stream's order of requests per (model, sequence id)."""

    def __init__(self) -> None:
        self._last: dict[_Key, asyncio.Future[None]] = {}

    def turn(self, request: pb.ModelInferRequest) -> _Turn:
        """Take ``request``'s place in its sequence's line; call in read order, before any
        await of the request's handling."""
        key = _key(request)
        if key is None:
            return _Turn(self, None, None, None)
        previous = self._last.get(key)
        mine: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._last[key] = mine
        return _Turn(self, key, previous, mine)

    def _done(self, key: _Key, mine: asyncio.Future[None]) -> None:
        mine.set_result(None)
        if self._last.get(key) is mine:
            del self._last[key]


class _Turn:
    def __init__(
        self,
        order: SequenceOrder,
        key: _Key | None,
        previous: asyncio.Future[None] | None,
        mine: asyncio.Future[None] | None,
    ) -> None:
        self._order, self._key = order, key
        self._previous, self._mine = previous, mine

    @asynccontextmanager
    async def wait(self) -> AsyncIterator[None]:
        """Wait for the previous request of the sequence; the next one waits for this."""
        try:
            if self._previous is not None:
                await asyncio.shield(self._previous)
            yield
        finally:
            if self._key is not None and self._mine is not None:
                self._order._done(self._key, self._mine)


def _key(request: pb.ModelInferRequest) -> _Key | None:
    if "sequence_id" not in request.parameters:
        return None
    value = parameter_value(request.parameters["sequence_id"])
    if not isinstance(value, int | str) or isinstance(value, bool) or value in (0, ""):
        return None
    return request.model_name, value
