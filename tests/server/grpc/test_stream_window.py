"""StreamWindow: a stream may read on while it holds less than its byte bound and runs fewer
requests than its bound; reading resumes when replies are sent or requests answered."""

from __future__ import annotations

import asyncio

from server import event_loop
from server.grpc.stream_window import StreamWindow


async def _has_room(window: StreamWindow) -> bool:
    try:
        await asyncio.wait_for(window.room(), 0.05)
    except TimeoutError:
        return False
    return True


def test_unsent_reply_bytes_pause_reading_until_sent() -> None:
    async def scenario() -> None:
        window = StreamWindow(max_bytes=100, max_running=10)
        window.read(10)
        assert await _has_room(window)
        window.answered(10, 95)  # the reply is larger than its request
        assert await _has_room(window)
        window.read(10)
        assert not await _has_room(window), "95 unsent + 10 read reach the bound"
        waiter = asyncio.create_task(window.room())
        window.sent(95)
        await asyncio.wait_for(waiter, 1)
        window.answered(10, 10)
        window.sent(10)
        assert await _has_room(window)

    event_loop.run(scenario())


def test_running_requests_pause_reading_until_one_is_answered() -> None:
    async def scenario() -> None:
        window = StreamWindow(max_bytes=1000, max_running=2)
        window.read(1)
        window.read(1)
        assert not await _has_room(window)
        waiter = asyncio.create_task(window.room())
        window.answered(1, 1)
        await asyncio.wait_for(waiter, 1)

    event_loop.run(scenario())


def test_a_request_larger_than_the_bound_is_read_while_under_it() -> None:
    async def scenario() -> None:
        window = StreamWindow(max_bytes=100, max_running=10)
        assert await _has_room(window)
        window.read(500)
        assert not await _has_room(window)
        window.answered(500, 500)
        assert not await _has_room(window)
        window.sent(500)
        assert await _has_room(window)

    event_loop.run(scenario())
