"""Stop signals and the exit deadline: ``--exit-timeout-secs`` holds whatever is still running.

Threads cannot be stopped, and Python waits for them before it exits: ``concurrent.futures``
joins every executor's threads (a model instance's worker, busy with an execution or a
``finalize``), ``asyncio.run`` joins the default executor's (a model load in progress). So a
model still running past the timeout used to keep the process alive for as long as it ran.

Here the first SIGINT or SIGTERM starts the shutdown and a watchdog thread: when the timeout
(plus a moment for the orderly steps) has passed, the process leaves with ``os._exit`` after
flushing the log, whatever is still running. A second signal leaves the same way at once.
``os._exit`` rather than daemon threads, because it covers every thread alike (ours, grpc's,
those a Python model starts) and skips interpreter finalization, which could free objects
under native code still running on them. The kernel closes every socket, so a client still
waiting sees its connection closed or its RPC fail; none is left hanging. The exit code is 0:
the stop was asked for, and the log says what was cut.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Coroutine
from types import FrameType
from typing import Any, NoReturn

log = logging.getLogger(__name__)

#: After the timeout, for the orderly steps: closing connections, releasing the models.
GRACE_SECS = 1.0
#: How long the last log lines may take to be written before the process leaves regardless
#: (a log destination that blocks must not keep it alive).
_FLUSH_SECS = 0.5
_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Shutdown:
    """The stop request, and the deadline by which the process is gone."""

    def __init__(self, exit_timeout_secs: float) -> None:
        self.requested = asyncio.Event()
        self._timeout = max(0.0, exit_timeout_secs)
        self._deadline: float | None = None
        self._loop = asyncio.get_running_loop()

    def install(self, signals: tuple[signal.Signals, ...] = _SIGNALS) -> None:
        """Take over SIGINT and SIGTERM (a child process of the supervisor: SIGTERM only).
        Plain signal handlers, not the loop's: a second signal must work also after the loop
        has stopped, while Python joins threads."""
        for signum in signals:
            signal.signal(signum, self._on_signal)

    def remaining(self) -> float:
        """Seconds left before the deadline (no stop requested yet: the whole allowance)."""
        if self._deadline is None:
            return self._timeout + GRACE_SECS
        return max(0.0, self._deadline - time.monotonic())

    async def unless_stopped(self, work: Coroutine[Any, Any, None]) -> bool:
        """Run ``work`` unless the stop comes first, which cancels it; whether it finished.
        Its exceptions come through."""
        task = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self.requested.wait())
        try:
            await asyncio.wait([task, stop], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task.done():
            task.result()
            return True
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._deadline is not None:
            exit_now(f"{signal.Signals(signum).name} again: exiting now")
        self._deadline = time.monotonic() + self._timeout + GRACE_SECS
        watchdog = threading.Timer(self._timeout + GRACE_SECS, self._expired)
        watchdog.daemon = True
        watchdog.start()
        # Runs on the main thread between two bytecodes, maybe inside the loop: hand over.
        self._loop.call_soon_threadsafe(self.requested.set)

    def _expired(self) -> None:
        exit_now(f"work still running past the exit timeout ({self._timeout:g} s): exiting now")


def exit_now(message: str) -> NoReturn:
    """Log ``message``, flush the log, and end the process (status 0) without waiting for any
    thread."""
    writer = threading.Thread(target=_last_words, args=(message,), daemon=True)
    writer.start()
    writer.join(_FLUSH_SECS)
    os._exit(0)


def _last_words(message: str) -> None:
    log.warning("%s", message)
    for handler in logging.getLogger().handlers:
        handler.flush()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
