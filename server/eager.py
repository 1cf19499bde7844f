"""Starting a coroutine at once, in the caller's step, and making it a task only if it waits.

A small request on a model that runs inline never waits in the executor: decoded, run and
answered in one go. A ``Task`` for it costs about as much as validating it (the task object,
its loop callback, the set of live tasks, the done callback), for nothing.

From Python 3.12 on, asyncio's own eager tasks do this, and ``start`` uses them: the first
step then runs inside its task, as code reached from it may need. There ``wait_for`` is built
on ``asyncio.timeout``, which refuses to run outside a task ("Timeout should be used inside a
task"): run outside one, model loads and unloads over gRPC in one process failed on 3.12 at
their wait for the version's requests to drain (``RequestGate.wait_idle``); run inside the
caller's task, the timeout would cancel the caller. 3.11, which has no eager tasks, runs the
first step outside any task; its ``wait_for`` needs none, but ``asyncio.timeout`` does, so code
that a first step reaches uses ``wait_for``.

On 3.11 every ``asyncio.get_running_loop()`` (and what calls it: ``asyncio.create_task``,
``current_task()``, ``Event.wait``, ``Future()`` without a loop) makes a ``getpid`` system call,
its check for a fork. Under load those were the executor's most frequent system call (2.3 per
batched request, against 0.8 reads, writes and polls together), so the hot paths keep their
loop and pass it.
"""

from __future__ import annotations

import asyncio
import collections.abc
import contextvars
import sys
from collections.abc import Coroutine, Generator
from typing import Any


def start(
    coroutine: Coroutine[Any, Any, None], loop: asyncio.AbstractEventLoop
) -> asyncio.Task[None] | None:
    """Run ``coroutine`` until it first waits; then a task on ``loop`` (the running one,
    which the caller keeps: looking it up is a system call on 3.11) runs the rest (returned),
    or None if it finished without waiting. Its first step runs in a copy of the caller's
    context, which the task goes on in, as a task's would. An exception from the first step
    is raised here."""
    if sys.version_info >= (3, 12):
        task = asyncio.Task(coroutine, loop=loop, eager_start=True)
        if not task.done():
            return task
        task.result()  # the first step's exception, if any, raised here
        return None
    context = contextvars.copy_context()
    try:
        awaited = context.run(coroutine.send, None)
    except StopIteration:
        return None
    return loop.create_task(_Started(coroutine, awaited), context=context)


class _Started(collections.abc.Coroutine[Any, Any, None]):
    """A started coroutine as a task drives it: the task's first step is handed what the
    coroutine already waits on; later steps, and anything thrown in, go to the coroutine."""

    def __init__(self, coroutine: Coroutine[Any, Any, None], awaited: Any) -> None:
        self._coroutine = coroutine
        self._awaited: Any = awaited
        self._first = True

    def send(self, value: Any) -> Any:
        if self._first:
            self._first = False
            return self._awaited
        return self._coroutine.send(value)

    def throw(self, *error: Any) -> Any:
        if self._first:
            # Cancelled before the task took over: the future waited on goes first, as the
            # task would have cancelled it (the coroutine then sees it cancelled).
            self._first = False
            if isinstance(self._awaited, asyncio.Future):
                self._awaited.cancel()
        return self._coroutine.throw(*error)

    def close(self) -> None:
        self._coroutine.close()

    def __await__(self) -> Generator[Any, Any, None]:
        raise TypeError("driven by its task only")
