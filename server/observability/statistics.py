"""Per model-version inference statistics, counted the way Triton counts them.

perf_analyzer computes its server-side latency breakdown from these counters, and its HTTP
parser reads every one of them without checking it exists, so every field is always filled
(triton-facts §0 item 6 and §5.2; Triton's ``core:src/infer_stats.cc``).

Counting follows Triton: ``success``, ``queue`` and ``compute_*`` are per request (each
request adds 1 and its own durations; a request in a batch is charged the whole execution's
compute times); ``inference_count`` counts samples; ``execution_count`` and ``batch_stats``
are per execution, keyed by the executed batch size.

Threading: the counters are plain ints, updated and read only on the event loop thread, so
they need no lock. Code running in worker threads must hand its timings back to the loop
(for example with the result of the future it completes) instead of recording them itself.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from server.generated import grpc_service_pb2 as pb
from server.protocol.proto_json import message_to_json

_NS_PER_MS = 1_000_000
#: Why a request failed, as Triton's ``nv_inference_request_failure{reason=...}`` tells it.
FAILURE_REASONS = ("REJECTED", "CANCELED", "BACKEND", "OTHER")
#: Upper bounds (µs) of the latency histogram buckets, plus +Inf: 100 µs to 10 s, about 2.5x
#: apart, so that p50 and p99 of both sub-millisecond and batched requests fall in a bucket.
LATENCY_BUCKETS_US = (
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 10_000_000,
)


@dataclass(slots=True)
class LatencyHistogram:
    """Cumulative counts of durations per ``LATENCY_BUCKETS_US`` bucket (the last is +Inf)."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_US) + 1))
    sum_us: float = 0.0


@dataclass(slots=True)
class Duration:
    """A count of events and their summed duration (``StatisticDuration``)."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int) -> None:
        """Count one event lasting ``ns``; a negative duration (clock step) counts as 0."""
        _count(((self, ns),))

    def fill(self, target: pb.StatisticDuration) -> None:
        """Copy into ``target``, marking it present so JSON prints it even when zero."""
        target.SetInParent()
        target.count = self.count
        target.ns = self.ns


def _count(events: tuple[tuple[Duration, int], ...]) -> None:
    """Count one event of each ``(duration, ns)``: ``Duration.add`` for several at once, one
    call where a request would make one per duration."""
    for duration, ns in events:
        duration.count += 1
        if ns > 0:
            duration.ns += ns


def _observe(events: tuple[tuple[LatencyHistogram, int], ...]) -> None:
    """Put each ``(histogram, ns)`` in its bucket (a negative duration counts as 0)."""
    for histogram, ns in events:
        us = ns / 1_000 if ns > 0 else 0.0
        histogram.counts[bisect.bisect_left(LATENCY_BUCKETS_US, us)] += 1
        histogram.sum_us += us


@dataclass(slots=True)
class BatchStats:
    """Compute durations of the executions run at one batch size (``InferBatchStatistics``)."""

    compute_input: Duration = field(default_factory=Duration)
    compute_infer: Duration = field(default_factory=Duration)
    compute_output: Duration = field(default_factory=Duration)


class ModelStats:
    """Cumulative statistics of one model version since it was loaded.

    Only touched from the event loop thread (see the module docstring); no locks.
    ``clock`` returns wall-clock nanoseconds since the epoch and is injectable for tests.
    """

    __slots__ = (
        "_clock",
        "batch_stats",
        "cache_hit",
        "cache_miss",
        "compute_infer",
        "compute_infer_histogram",
        "compute_input",
        "compute_output",
        "execution_count",
        "fail",
        "failures",
        "inference_count",
        "last_inference_ms",
        "load_ns",
        "queue",
        "queue_histogram",
        "request_histogram",
        "success",
    )

    def __init__(self, clock: Callable[[], int] = time.time_ns) -> None:
        self._clock = clock
        self.success = Duration()
        self.fail = Duration()
        self.queue = Duration()
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()
        # The response cache's lookups (always present: perf_analyzer reads them).
        self.cache_hit = Duration()
        self.cache_miss = Duration()
        self.inference_count = 0
        self.execution_count = 0
        self.last_inference_ms = 0
        self.batch_stats: dict[int, BatchStats] = {}
        # For the metrics endpoint (the statistics extension has no place for them).
        self.failures = dict.fromkeys(FAILURE_REASONS, 0)
        self.request_histogram = LatencyHistogram()
        self.queue_histogram = LatencyHistogram()
        self.compute_infer_histogram = LatencyHistogram()
        self.load_ns = 0  # how long loading this version took

    def record_success(
        self,
        request_ns: int,
        queue_ns: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
        batch_size: int,
    ) -> None:
        """Count one request that succeeded.

        ``request_ns`` is end to end, ``queue_ns`` from enqueue to compute start, and the
        ``compute_*_ns`` are those of the execution that ran it (the whole batch's, as in
        Triton). ``batch_size`` is the request's own sample count (1 for a model without
        batching); it is what ``inference_count`` adds.
        """
        # Two calls for the eight counts: this runs once per request.
        _count(
            (
                (self.success, request_ns),
                (self.queue, queue_ns),
                (self.compute_input, compute_input_ns),
                (self.compute_infer, compute_infer_ns),
                (self.compute_output, compute_output_ns),
            )
        )
        self.inference_count += batch_size
        _observe(
            (
                (self.request_histogram, request_ns),
                (self.queue_histogram, queue_ns),
                (self.compute_infer_histogram, compute_infer_ns),
            )
        )
        self._touch()

    def record_cache_hit(self, request_ns: int, queue_ns: int, lookup_ns: int) -> None:
        """Count one request answered from the response cache. As in Triton it is a success
        and is queued (up to the lookup), but runs no execution, so ``inference_count`` and
        the compute durations leave it out; ``lookup_ns`` covers the lookup and copy-out."""
        _count(((self.success, request_ns), (self.queue, queue_ns), (self.cache_hit, lookup_ns)))
        _observe(((self.request_histogram, request_ns), (self.queue_histogram, queue_ns)))
        self._touch()

    def record_cache_miss(self, lookup_ns: int) -> None:
        """Count one lookup that found nothing; ``lookup_ns`` covers the lookup and the
        insert of the answer afterwards. The request itself is counted by
        ``record_success``."""
        self.cache_miss.add(lookup_ns)

    def record_failure(self, request_ns: int, reason: str = "OTHER") -> None:
        """Count one request that failed after ``request_ns`` for ``reason`` (one of
        ``FAILURE_REASONS``; the statistics extension only has the total)."""
        self.fail.add(request_ns)
        self.failures[reason if reason in self.failures else "OTHER"] += 1

    def record_execution(
        self,
        batch_size: int,
        compute_input_ns: int,
        compute_infer_ns: int,
        compute_output_ns: int,
    ) -> None:
        """Count one model execution of ``batch_size`` samples (1 for a model without batching).

        Triton stamps ``last_inference`` here too; both stamps keep the latest time.
        """
        self.execution_count += 1
        stats = self.batch_stats.get(batch_size)
        if stats is None:
            stats = self.batch_stats[batch_size] = BatchStats()
        _count(
            (
                (stats.compute_input, compute_input_ns),
                (stats.compute_infer, compute_infer_ns),
                (stats.compute_output, compute_output_ns),
            )
        )
        self._touch()

    def _touch(self) -> None:
        now = self._clock() // _NS_PER_MS
        if now > self.last_inference_ms:  # noqa: PLR1730 - no call: this runs per request
            self.last_inference_ms = now

    def to_proto(self, name: str, version: str) -> pb.ModelStatistics:
        """These statistics as the ``ModelStatistics`` message, every field filled.

        ``response_stats`` (decoupled models only) and ``memory_usage`` are empty.
        """
        message = pb.ModelStatistics(
            name=name,
            version=version,
            last_inference=self.last_inference_ms,
            inference_count=self.inference_count,
            execution_count=self.execution_count,
        )
        infer = message.inference_stats
        infer.SetInParent()
        self.success.fill(infer.success)
        self.fail.fill(infer.fail)
        self.queue.fill(infer.queue)
        self.compute_input.fill(infer.compute_input)
        self.compute_infer.fill(infer.compute_infer)
        self.compute_output.fill(infer.compute_output)
        self.cache_hit.fill(infer.cache_hit)
        self.cache_miss.fill(infer.cache_miss)
        for batch_size in sorted(self.batch_stats):
            stats = self.batch_stats[batch_size]
            batch = message.batch_stats.add(batch_size=batch_size)
            stats.compute_input.fill(batch.compute_input)
            stats.compute_infer.fill(batch.compute_infer)
            stats.compute_output.fill(batch.compute_output)
        return message


def statistics_response(
    entries: Iterable[tuple[str, str, ModelStats]],
) -> pb.ModelStatisticsResponse:
    """The response for ``(model name, version, stats)`` entries, in the order given."""
    response = pb.ModelStatisticsResponse()
    for name, version, stats in entries:
        response.model_stats.append(stats.to_proto(name, version))
    return response


def statistics_json(response: pb.ModelStatisticsResponse) -> dict[str, Any]:
    """``response`` as the HTTP statistics endpoint prints it: every field, all numbers."""
    return message_to_json(response)
