"""A background event loop per python model instance, for ``async def`` model methods.

Triton runs a model's coroutines (``async def execute``, ``is_ready``) on an event loop of
its own beside the model's thread; so does this: the instance's worker thread hands the
coroutine to the loop and waits for its result, while a readiness check may run another
coroutine on the same loop meanwhile. The loop is started on first use and stopped when the
instance closes, so models that never use ``async`` cost nothing.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


class CoroutineRunner:
    """Runs coroutines to completion on one loop thread, from any other thread."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    def run(self, awaitable: Awaitable[T]) -> T:
        """Wait for ``awaitable`` on the loop; its exception is raised here."""
        loop = self._started()
        coroutine = awaitable if asyncio.iscoroutine(awaitable) else _wrap(awaitable)
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result()

    def _started(self) -> asyncio.AbstractEventLoop:
        with self._lock:
            if self._loop is None:
                loop = asyncio.new_event_loop()
                thread = threading.Thread(
                    target=loop.run_forever, name=f"{self._name}-async", daemon=True
                )
                thread.start()
                self._loop, self._thread = loop, thread
            return self._loop

    def close(self) -> None:
        """Stop the loop (if it was started) once what runs on it has given way."""
        with self._lock:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        if not thread.is_alive():
            loop.close()


def _wrap(awaitable: Awaitable[T]) -> Coroutine[Any, Any, T]:
    async def waiting() -> T:
        return await awaitable

    return waiting()
