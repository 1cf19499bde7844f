"""One measured step per concurrency, in order: spread the slots over the client processes,
warm up, read the server's statistics, measure, read them again, check the responses.

With ``--workers`` left to the tool, the sweep starts with one client process and, whenever a
step finds a client process over ``CLIENT_BUSY_LIMIT`` busy, starts one more and measures that
step again (up to one process per core and per slot): the figures it reports are then the
server's, not the client's. A fixed ``--workers`` is kept, and client-bound steps are flagged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from server.loadtest.errors import BenchError
from server.loadtest.measurements import (
    CLIENT_BUSY_LIMIT,
    Sample,
    ServerBreakdown,
    ServerCounters,
    StepResult,
)
from server.loadtest.progress import SweepProgress
from server.loadtest.workers import split


@dataclass(frozen=True)
class SweepPlan:
    concurrencies: tuple[int, ...]
    measurement_s: float
    warmup_s: float
    max_requests: int | None  # per step (measurement), shared out among the client processes
    workers: int | None  # None: start with one and add processes while the client is the limit
    max_workers: int  # the most processes the automatic choice may use

    @property
    def seconds_per_step(self) -> float:
        return self.warmup_s + self.measurement_s


class ClientPool(Protocol):
    """What the sweep needs of its client processes (``workers.WorkerPool``)."""

    @property
    def size(self) -> int: ...

    def grow(self, count: int = 1) -> None: ...

    def open(self, slots: Sequence[int]) -> None: ...

    def run(
        self, seconds: float, max_requests: int | None, tick: Callable[[], None]
    ) -> list[Sample]: ...

    def close_connections(self) -> None: ...


class Sweep:
    """Runs a plan on a worker pool. ``results`` fills step by step, so a sweep cut short
    (Ctrl-C, a failure) still has what it measured; ``notes`` are lines for the user."""

    def __init__(
        self,
        pool: ClientPool,
        plan: SweepPlan,
        rows_per_request: int,
        read_counters: Callable[[], ServerCounters | None],
        check_response: Callable[[bytes], list[str]],
        progress: SweepProgress,
    ) -> None:
        self._pool = pool
        self._plan = plan
        self._rows = rows_per_request
        self._read_counters = read_counters
        self._check_response = check_response
        self._progress = progress
        self.results: list[StepResult] = []
        self.notes: list[str] = []

    def run(self) -> list[StepResult]:
        for concurrency in self._plan.concurrencies:
            result = self._step(concurrency)
            self.results.append(result)
            self._progress.show(
                f"concurrency {concurrency}: {result.throughput:,.0f} infer/s, "
                f"p99 {result.latency.p99_ms:.2f} ms"
            )
        return self.results

    def _step(self, concurrency: int) -> StepResult:
        while True:
            result = self._measure(concurrency)
            limit = min(self._plan.max_workers, concurrency)
            if self._plan.workers is not None or not result.client_bound:
                return result
            if self._pool.size >= limit:
                return result
            self._progress.write(
                f"concurrency {concurrency}: a client process was "
                f"{result.busiest_worker:.0%} busy (over {CLIENT_BUSY_LIMIT:.0%}); measuring "
                f"again with {self._pool.size + 1} client processes"
            )
            self._pool.grow()
            self._progress.extend(self._plan.seconds_per_step)

    def _measure(self, concurrency: int) -> StepResult:
        plan, progress = self._plan, self._progress
        self._pool.open(split(concurrency, self._pool.size))
        label = f"concurrency {concurrency}"
        warm: list[Sample] = []
        if plan.warmup_s > 0:
            progress.begin(f"{label}, warm-up", plan.warmup_s)
            warm = self._pool.run(plan.warmup_s, None, progress.tick)
            progress.end()
        before = self._read_counters()
        progress.begin(label, plan.measurement_s)
        samples = self._pool.run(plan.measurement_s, plan.max_requests, progress.tick)
        progress.end()
        after = self._read_counters()
        self._pool.close_connections()
        self._check_first_response(concurrency, [*warm, *samples])
        server = None
        if before is not None and after is not None:
            server = ServerBreakdown.of(after - before)
        result = StepResult.combine(concurrency, self._rows, samples, server)
        self._note_foreign_load(result)
        return result

    def _check_first_response(self, concurrency: int, samples: Sequence[Sample]) -> None:
        """The step's first response must be a success with every output: measuring a request
        the server refuses would only time its error path."""
        first = next((s.first_response for s in samples if s.first_response), b"")
        if not first:
            error = next((s.first_error for s in samples if s.first_error), "no error either")
            raise BenchError(f"concurrency {concurrency}: no response from the server ({error})")
        problems = self._check_response(first)
        if problems:
            raise BenchError(
                f"concurrency {concurrency}: the server's response is not a success: "
                + "; ".join(problems)
            )

    def _note_foreign_load(self, result: StepResult) -> None:
        """The server counting more requests than this client sent means other clients share
        the model, and its per-request figures include their requests."""
        if result.server is not None and result.server.requests > result.requests:
            self.notes.append(
                f"concurrency {result.concurrency}: the server counted "
                f"{result.server.requests:,} successful requests, this client "
                f"{result.requests:,}: the server-side figures include other clients' load"
            )
