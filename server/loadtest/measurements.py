"""What a sweep measures, and the arithmetic on it: latency percentiles, client CPU, and the
server's statistics-extension counters before and after a step.

Plain data and standard-library math only: client processes import this module, and the
scripts' benchmarks share ``Sample`` and ``percentile`` with the tool.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

#: A client process busier than this share of one core over a step cannot be trusted to have
#: sent requests as fast as the closed loop asks: the step's figures may be client-bound.
CLIENT_BUSY_LIMIT = 0.8


@dataclass
class Sample:
    """What one timed run of a load generator measured; latencies and CPU times in seconds.

    ``requests`` counts answered calls; the tool's generators count a failed call in ``errors``
    only, so ``requests`` are successes there. ``first_response`` is kept to check it;
    ``first_error`` says what went wrong first, for the message a user sees.
    """

    requests: int = 0
    errors: int = 0
    elapsed: float = 0.0
    client_cpu: float = 0.0
    latencies: list[float] = field(default_factory=list)
    first_response: bytes = b""
    first_error: str = ""

    @property
    def rate(self) -> float:
        return self.requests / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def busy(self) -> float:
        """CPU seconds per wall second of the process that ran the load (1.0 = one core)."""
        return self.client_cpu / self.elapsed if self.elapsed > 0 else 0.0

    def percentile_ms(self, q: float) -> float:
        return percentile(sorted(self.latencies), q) * 1e3

    def note_error(self, message: str) -> None:
        self.errors += 1
        if not self.first_error:
            self.first_error = message


def percentile(ordered: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted values (``q`` in 0..1), so that p99 is a value that
    was really measured rather than an interpolation between two; NaN when there is none."""
    if not ordered:
        return math.nan
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


@dataclass(frozen=True)
class LatencySummary:
    """Client-side latency of the successful requests of a step, in milliseconds."""

    count: int
    avg_ms: float
    p50_ms: float
    p90_ms: float
    p95_ms: float
    p99_ms: float

    @classmethod
    def of(cls, latencies: Iterable[float]) -> LatencySummary:
        ordered = sorted(latencies)
        if not ordered:
            return cls(0, math.nan, math.nan, math.nan, math.nan, math.nan)
        return cls(
            len(ordered),
            math.fsum(ordered) / len(ordered) * 1e3,
            *(percentile(ordered, q) * 1e3 for q in (0.5, 0.9, 0.95, 0.99)),
        )


# --- statistics extension --------------------------------------------------------------------


@dataclass(frozen=True)
class Duration:
    """One ``{"count", "ns"}`` pair of the statistics extension."""

    count: int = 0
    ns: int = 0

    def __sub__(self, other: Duration) -> Duration:
        return Duration(self.count - other.count, self.ns - other.ns)

    def __add__(self, other: Duration) -> Duration:
        return Duration(self.count + other.count, self.ns + other.ns)

    def average_us(self) -> float:
        return self.ns / self.count / 1e3 if self.count > 0 else math.nan


#: The ``inference_stats`` entries the tool reads, in the order the report shows them.
INFERENCE_STATS = ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output")


@dataclass(frozen=True)
class ServerCounters:
    """A model's cumulative statistics (summed over the versions the server reported). The
    difference of two readings is what the server did between them."""

    inference_count: int = 0
    execution_count: int = 0
    success: Duration = Duration()
    fail: Duration = Duration()
    queue: Duration = Duration()
    compute_input: Duration = Duration()
    compute_infer: Duration = Duration()
    compute_output: Duration = Duration()

    def __sub__(self, earlier: ServerCounters) -> ServerCounters:
        return ServerCounters(
            **{f.name: getattr(self, f.name) - getattr(earlier, f.name) for f in fields(self)}
        )

    def __add__(self, other: ServerCounters) -> ServerCounters:
        return ServerCounters(
            **{f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        )

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> ServerCounters:
        """From the HTTP statistics response ``{"model_stats": [...]}`` (numbers may come as
        strings, as protobuf's JSON mapping writes 64-bit integers)."""
        total = cls()
        for entry in document.get("model_stats", []):
            stats = entry.get("inference_stats", {})
            durations = {
                name: Duration(
                    int(stats.get(name, {}).get("count", 0)), int(stats.get(name, {}).get("ns", 0))
                )
                for name in INFERENCE_STATS
            }
            total += cls(
                int(entry.get("inference_count", 0)),
                int(entry.get("execution_count", 0)),
                **durations,
            )
        return total


@dataclass(frozen=True)
class ServerBreakdown:
    """Where the server spent a step's requests, per request, from a counters delta."""

    requests: int  # successful requests the server counted over the step
    failures: int
    request_us: float  # end to end inside the server
    queue_us: float
    compute_input_us: float
    compute_infer_us: float
    compute_output_us: float
    avg_batch_size: float  # rows per model execution

    @classmethod
    def of(cls, delta: ServerCounters) -> ServerBreakdown:
        executions = delta.execution_count
        return cls(
            requests=delta.success.count,
            failures=delta.fail.count,
            request_us=delta.success.average_us(),
            queue_us=delta.queue.average_us(),
            compute_input_us=delta.compute_input.average_us(),
            compute_infer_us=delta.compute_infer.average_us(),
            compute_output_us=delta.compute_output.average_us(),
            avg_batch_size=delta.inference_count / executions if executions > 0 else math.nan,
        )


# --- one step of a sweep ---------------------------------------------------------------------


@dataclass(frozen=True)
class StepResult:
    """Everything measured at one concurrency."""

    concurrency: int
    batch_size: int  # rows per request
    requests: int  # successful
    errors: int
    elapsed: float  # seconds of the measurement window
    latency: LatencySummary
    worker_busy: tuple[float, ...]  # CPU share of one core, per client process with slots
    server: ServerBreakdown | None  # None when the server has no statistics extension
    first_error: str = ""

    @property
    def workers(self) -> int:
        return len(self.worker_busy)

    @property
    def throughput(self) -> float:
        """Successful inferences (requests) per second."""
        return self.requests / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def rows_per_s(self) -> float:
        return self.throughput * self.batch_size

    @property
    def busiest_worker(self) -> float:
        return max(self.worker_busy, default=0.0)

    @property
    def client_bound(self) -> bool:
        """Whether a client process was too busy for the figures to be the server's."""
        return self.busiest_worker > CLIENT_BUSY_LIMIT

    @classmethod
    def combine(
        cls,
        concurrency: int,
        batch_size: int,
        samples: Sequence[Sample],
        server: ServerBreakdown | None,
    ) -> StepResult:
        """One result from the samples of the client processes that took part; the window is
        the longest of theirs (they start within a few milliseconds of one another)."""
        return cls(
            concurrency=concurrency,
            batch_size=batch_size,
            requests=sum(s.requests for s in samples),
            errors=sum(s.errors for s in samples),
            elapsed=max((s.elapsed for s in samples), default=0.0),
            latency=LatencySummary.of(x for s in samples for x in s.latencies),
            worker_busy=tuple(s.busy for s in samples),
            server=server,
            first_error=next((s.first_error for s in samples if s.first_error), ""),
        )
