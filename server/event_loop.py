"""The event loop every server process runs on: uvloop where it is installed, else asyncio's.

uvloop's loop is libuv's, written in Cython: each callback, socket read and write costs less
CPU than in asyncio's pure-Python loop, which matters at thousands of small requests a second.
Tornado's delegates, the gRPC connections, the threads handing results back (``call_soon_threadsafe``) and the plain
signal handlers of ``server.shutdown`` all work on it unchanged.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor when uvloop is importable; None (asyncio's default) else."""
    try:
        import uvloop
    except ImportError:  # not installed (it has no Windows build): asyncio's own loop
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on the loop ``loop_factory`` picks."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
