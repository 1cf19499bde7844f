"""Work handed to threads, waited for without abandoning it on cancellation.

A thread cannot be stopped. When the coroutine awaiting it is cancelled (a client went away),
the thread still reads the request's buffers; returning at once would let those buffers be
reused under it. So cancellation is let through only once the thread is done.

A model instance's executions go to a ``WorkerThread`` of its own, not to a one-thread
``ThreadPoolExecutor``: handing a call to that pool and awaiting it through
``run_in_executor`` cost 107-123 µs of CPU per call (its ``Future`` with a ``Condition``, the
pool's idle semaphore, ``wrap_future`` and ``shield`` chaining three futures), against 31-36 µs
for a queue and one ``call_soon_threadsafe`` into the loop's future (a call returning at once,
20,000 in a row, 2-core VM). Under dynamic batching most batches cross to the instance's
thread, and every execution of a python model does.
"""

from __future__ import annotations

import asyncio
import functools
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


async def run_in_thread(function: Callable[..., T], *args: object) -> T:
    """``function(*args)`` on the loop's default pool (for work that is rare or large:
    codecs, compression, driver calls)."""
    loop = asyncio.get_running_loop()
    future = loop.run_in_executor(None, functools.partial(function, *args))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():  # even if cancelled again meanwhile
            try:
                await asyncio.wait([future])
            except asyncio.CancelledError:
                continue
        if not future.cancelled():
            future.exception()  # nobody reads the result: do not report it as unretrieved
        raise


@dataclass(eq=False)
class _Call(Generic[T]):
    """One call handed to a ``WorkerThread``; ``finished`` and ``waiter`` live on the loop."""

    loop: asyncio.AbstractEventLoop
    result: asyncio.Future[T]
    function: Callable[..., T]
    args: tuple[object, ...]
    finished: bool = False
    waiter: asyncio.Future[None] | None = None


class WorkerThread:
    """One thread running the calls handed to it, in order (a model instance's)."""

    def __init__(self, name: str) -> None:
        self._calls: queue.SimpleQueue[_Call[Any] | None] = queue.SimpleQueue()
        # A daemon: an interpreter exiting never waits for a model run (a forced stop leaves
        # with os._exit anyway); an orderly close joins it (``stop``).
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._stopped = False

    async def run(
        self,
        function: Callable[..., T],
        *args: object,
        on_cancel: Callable[[], None] | None = None,
    ) -> T:
        """``function(*args)`` on the thread, after the calls before it. ``on_cancel`` is
        called when a cancellation first arrives, while the thread still runs (to tell it);
        the cancellation goes through once the thread is done with the call."""
        if self._stopped:
            raise RuntimeError(f"thread {self._thread.name} is stopped")
        if not self._thread.is_alive():
            self._thread.start()
        loop = asyncio.get_running_loop()
        result: asyncio.Future[T] = loop.create_future()
        call = _Call(loop, result, function, args)
        self._calls.put(call)
        try:
            return await call.result
        except asyncio.CancelledError:
            if on_cancel is not None:
                on_cancel()
            while not call.finished:  # even if cancelled again meanwhile
                call.waiter = loop.create_future()
                try:
                    await call.waiter
                except asyncio.CancelledError:
                    continue
            if not call.result.cancelled():
                call.result.exception()  # nobody reads it: not "unretrieved"
            raise

    def stop(self, wait: bool = True) -> None:
        """Take no more calls; the thread ends after those queued (``wait``: once it has)."""
        if self._stopped:
            return
        self._stopped = True
        self._calls.put(None)
        if wait and self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            value: Any = None
            error: BaseException | None = None
            try:
                value = call.function(*call.args)
            except BaseException as exc:  # noqa: BLE001 - the caller gets it, as from a pool
                error = exc
            try:
                call.loop.call_soon_threadsafe(_settle, call, value, error)
            except RuntimeError:  # the loop is closed: nobody waits for it any more
                pass
            del call, value, error  # no references held while waiting for the next


def _settle(call: _Call[Any], value: Any, error: BaseException | None) -> None:
    """On the loop: the call is done; its result goes to a caller still waiting."""
    call.finished = True
    if not call.result.done():
        if error is None:
            call.result.set_result(value)
        else:
            call.result.set_exception(error)
    if call.waiter is not None and not call.waiter.done():
        call.waiter.set_result(None)


#: Codec work on more tensor bytes than this (parsing or writing a large JSON body, many
#: BYTES elements) runs on a worker thread, so the loop keeps answering other clients.
OFF_LOOP_BYTES = 1 << 20


async def off_loop_if_large(nbytes: int, function: Callable[..., T], *args: object) -> T:
    """``function(*args)``: inline for small payloads, on the default pool (through
    ``run_in_thread``) above ``OFF_LOOP_BYTES``."""
    if nbytes > OFF_LOOP_BYTES:
        return await run_in_thread(function, *args)
    return function(*args)
