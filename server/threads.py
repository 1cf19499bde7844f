"""Waiting for work handed to threads without abandoning it on cancellation.

A thread cannot be stopped. When the coroutine awaiting it is cancelled (a client went away),
the thread still reads the request's buffers; returning at once would let those buffers be
reused under it. So cancellation is let through only once the thread is done.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import Executor
from typing import TypeVar

T = TypeVar("T")


async def run_in_thread(
    executor: Executor | None,
    function: Callable[..., T],
    *args: object,
    on_cancel: Callable[[], None] | None = None,
) -> T:
    """``function(*args)`` on ``executor`` (None: the loop's default pool); ``on_cancel`` is
    called when a cancellation first arrives, while the thread still runs (to tell it)."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(executor, functools.partial(function, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        if on_cancel is not None:
            on_cancel()
        while not future.done():  # even if cancelled again meanwhile
            try:
                await asyncio.wait([future])
            except asyncio.CancelledError:
                continue
        if not future.cancelled():
            future.exception()  # nobody reads the result: do not report it as unretrieved
        raise


#: Codec work on more tensor bytes than this (parsing or writing a large JSON body, many
#: BYTES elements) runs on a worker thread, so the loop keeps answering other clients.
OFF_LOOP_BYTES = 1 << 20


async def off_loop_if_large(nbytes: int, function: Callable[..., T], *args: object) -> T:
    """``function(*args)``: inline for small payloads, on the default pool (through
    ``run_in_thread``) above ``OFF_LOOP_BYTES``."""
    if nbytes > OFF_LOOP_BYTES:
        return await run_in_thread(None, function, *args)
    return function(*args)
