"""Client processes: the slots of a step are spread over ``--workers`` processes (spawned), each
running one asyncio loop with one load generator, so that the load is not limited to what one
Python interpreter (one GIL) can send.

The main process drives them in lock step through pipes: open the step's connections, run the
warm-up, run the measurement, close. Between those phases no request is in flight, so the
server's statistics read between them belong to the measured requests alone. A worker measures
its own CPU time over each phase, which is how the sweep knows whether the client kept up.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import signal
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Literal

from server.loadtest.cache_mix import CacheMix, RequestStream
from server.loadtest.clients import GrpcLoadGenerator, HttpLoadGenerator
from server.loadtest.errors import BenchError
from server.loadtest.measurements import Sample

_START_S = 60.0  # a spawned process imports grpc before it answers; a loaded machine is slow
_OPEN_S = 120.0  # opening a step's connections
_REPLY_GRACE_S = 120.0  # beyond a phase's length (the generators give up on a call after 60 s)


@dataclass(frozen=True)
class LoadTarget:
    """What every worker sends, and where: picklable, passed once to each process."""

    protocol: Literal["http", "grpc"]
    host: str
    port: int
    request: bytes
    mix: CacheMix | None = None  # --cache-hit-ratio


# --- in the worker process -------------------------------------------------------------------


def worker_main(pipe: Connection, target: LoadTarget) -> None:
    """Entry point of a client process: answer the main process's commands until ``stop``.
    Ctrl-C is the main process's to handle (it stops the workers), so it is ignored here."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_serve(pipe, target))


async def _serve(pipe: Connection, target: LoadTarget) -> None:
    generator: HttpLoadGenerator | GrpcLoadGenerator | None = None
    pipe.send(("ready", None))
    while True:
        try:
            command, *args = pipe.recv()  # blocks the loop; nothing is in flight between phases
        except EOFError:  # the main process is gone: so is the reason to run
            command, args = "stop", []
        try:
            if command == "stop":
                if generator is not None:
                    await generator.close()
                return
            if command == "open":
                if generator is not None:
                    await generator.close()
                generator = _generator(target, int(args[0]))
                await generator.connect()
                reply: Any = None
            elif command == "run":
                assert generator is not None, "run before open"
                reply = await generator.run_for(float(args[0]), int(args[1]), Sample())
            elif command == "close":
                if generator is not None:
                    await generator.close()
                generator = None
                reply = None
            else:
                raise ValueError(f"unknown command {command!r}")
        except Exception as exc:  # noqa: BLE001 - reported to the main process, which decides
            pipe.send(("error", f"{type(exc).__name__}: {exc}" if str(exc) else repr(exc)))
        else:
            pipe.send(("ok", reply))


def _generator(target: LoadTarget, slots: int) -> HttpLoadGenerator | GrpcLoadGenerator:
    address = (target.host, target.port)
    requests = RequestStream(target.request, target.mix)
    if target.protocol == "grpc":
        return GrpcLoadGenerator(address, requests, slots)
    return HttpLoadGenerator(address, requests, slots)


# --- in the main process ---------------------------------------------------------------------


def split(total: int, parts: int) -> list[int]:
    """``total`` as ``parts`` near-equal shares, larger first (slots or request caps)."""
    base, extra = divmod(total, parts)
    return [base + (1 if index < extra else 0) for index in range(parts)]


class WorkerPool:
    """The client processes this sweep started (and only those: it stops them itself)."""

    def __init__(self, target: LoadTarget, count: int) -> None:
        self._target = target
        self._context = multiprocessing.get_context("spawn")
        self._processes: list[BaseProcess] = []
        self._pipes: list[Connection] = []
        self._busy: list[Connection] = []  # pipes of the workers that have slots this step
        try:
            self.grow(count)
        except BaseException:
            self.shutdown()
            raise

    @property
    def size(self) -> int:
        return len(self._processes)

    def grow(self, count: int = 1) -> None:
        """Start ``count`` more client processes and wait until each can take commands."""
        started = []
        for _ in range(count):
            ours, theirs = self._context.Pipe()
            process = self._context.Process(
                target=worker_main, args=(theirs, self._target), daemon=True
            )
            process.start()
            theirs.close()
            self._processes.append(process)
            self._pipes.append(ours)
            started.append(ours)
        self._collect(started, _START_S, "start")

    def open(self, slots: Sequence[int]) -> None:
        """Give worker ``i`` ``slots[i]`` connections (slot counts of 0 leave it idle)."""
        self._busy = [pipe for pipe, n in zip(self._pipes, slots, strict=True) if n > 0]
        for pipe, n in zip(self._pipes, slots, strict=True):
            if n > 0:
                pipe.send(("open", n))
        self._collect(self._busy, _OPEN_S, "connect")

    def run(
        self, seconds: float, max_requests: int | None, tick: Callable[[], None] = lambda: None
    ) -> list[Sample]:
        """One phase on every worker with slots; ``max_requests`` is shared out among them.
        ``tick`` is called about ten times a second while they run (for the progress bar)."""
        caps = (
            split(max_requests, len(self._busy))
            if max_requests is not None
            else [2**62] * len(self._busy)
        )
        for pipe, cap in zip(self._busy, caps, strict=True):
            pipe.send(("run", seconds, cap))
        replies = self._collect(self._busy, seconds + _REPLY_GRACE_S, "run", tick)
        return [reply for reply in replies if isinstance(reply, Sample)]

    def close_connections(self) -> None:
        for pipe in self._busy:
            pipe.send(("close",))
        self._collect(self._busy, _OPEN_S, "close")
        self._busy = []

    def _collect(
        self,
        pipes: Sequence[Connection],
        timeout: float,
        what: str,
        tick: Callable[[], None] = lambda: None,
    ) -> list[Any]:
        """Each pipe's reply, in order; a worker that failed, died or hung ends the sweep."""
        replies: dict[Connection, Any] = {}
        deadline = time.monotonic() + timeout
        while len(replies) < len(pipes):
            waiting = [pipe for pipe in pipes if pipe not in replies]
            for pipe in wait(waiting, timeout=0.1):
                assert isinstance(pipe, Connection)
                try:
                    status, payload = pipe.recv()
                except (EOFError, OSError):
                    raise BenchError(f"a client process died during {what}") from None
                if status == "error":
                    raise BenchError(f"a client process failed to {what}: {payload}")
                replies[pipe] = payload
            tick()
            if time.monotonic() > deadline:
                raise BenchError(f"a client process did not {what} within {timeout:g} s")
        return [replies[pipe] for pipe in pipes]

    def shutdown(self) -> None:
        """Ask each worker to stop; terminate, by its own handle, any that does not."""
        for pipe in self._pipes:
            try:
                pipe.send(("stop",))
            except OSError:
                pass
        for process in self._processes:
            process.join(5)
            if process.is_alive():
                process.terminate()
                process.join(5)
        for pipe in self._pipes:
            pipe.close()
        self._processes, self._pipes, self._busy = [], [], []
