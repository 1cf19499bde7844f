"""Percentiles, latency summaries, the statistics delta and what a step's result derives."""

from __future__ import annotations

import math

import pytest

from server.loadtest.measurements import (
    Duration,
    LatencySummary,
    Sample,
    ServerBreakdown,
    ServerCounters,
    StepResult,
    percentile,
)


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]  # 1..100
    assert percentile(values, 0.5) == 50.0
    assert percentile(values, 0.9) == 90.0
    assert percentile(values, 0.99) == 99.0
    assert percentile(values, 1.0) == 100.0
    assert percentile(values, 0.0) == 1.0
    assert percentile([7.0], 0.99) == 7.0
    assert percentile([1.0, 2.0, 3.0], 0.5) == 2.0  # ceil(1.5) = rank 2
    assert percentile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0  # a measured value, not 2.5
    assert math.isnan(percentile([], 0.5))


def test_latency_summary_in_milliseconds() -> None:
    latencies = [i / 1000 for i in range(200, 0, -1)]  # 0.001 .. 0.2 s, unsorted
    summary = LatencySummary.of(latencies)
    assert summary.count == 200
    assert summary.avg_ms == pytest.approx(100.5)
    assert (summary.p50_ms, summary.p90_ms, summary.p95_ms, summary.p99_ms) == pytest.approx(
        (100.0, 180.0, 190.0, 198.0)
    )
    empty = LatencySummary.of([])
    assert empty.count == 0 and math.isnan(empty.p99_ms)


def _stats(success: int, ns: int, inference: int, execution: int) -> dict[str, object]:
    pair = {"count": success, "ns": ns}
    return {
        "name": "m",
        "version": "1",
        "inference_count": inference,
        "execution_count": execution,
        "inference_stats": {
            "success": pair,
            "fail": {"count": 0, "ns": 0},
            "queue": {"count": success, "ns": ns // 10},
            "compute_input": {"count": success, "ns": ns // 20},
            "compute_infer": {"count": success, "ns": ns // 2},
            "compute_output": {"count": success, "ns": ns // 40},
        },
    }


def test_counters_from_json_sum_versions_and_take_string_numbers() -> None:
    document = {
        "model_stats": [
            _stats(10, 10_000, 40, 10),
            {**_stats(5, 5_000, 5, 5), "inference_count": "5"},  # 64-bit ints as strings
        ]
    }
    counters = ServerCounters.from_json(document)
    assert counters.success == Duration(15, 15_000)
    assert counters.inference_count == 45 and counters.execution_count == 15
    assert ServerCounters.from_json({}) == ServerCounters()


def test_breakdown_of_a_delta() -> None:
    before = ServerCounters.from_json({"model_stats": [_stats(100, 1_000_000, 400, 100)]})
    after = ServerCounters.from_json({"model_stats": [_stats(300, 5_000_000, 1_200, 150)]})
    breakdown = ServerBreakdown.of(after - before)
    assert breakdown.requests == 200
    assert breakdown.request_us == pytest.approx(20.0)  # 4 ms over 200 requests
    assert breakdown.queue_us == pytest.approx(2.0)
    assert breakdown.compute_input_us == pytest.approx(1.0)
    assert breakdown.compute_infer_us == pytest.approx(10.0)
    assert breakdown.compute_output_us == pytest.approx(0.5)
    assert breakdown.avg_batch_size == pytest.approx(800 / 50)
    idle = ServerBreakdown.of(ServerCounters())
    assert math.isnan(idle.queue_us) and math.isnan(idle.avg_batch_size)


def test_step_result_combines_workers() -> None:
    one = Sample(
        requests=300,
        errors=1,
        elapsed=2.0,
        client_cpu=0.5,
        latencies=[0.001] * 300,
        first_error="HTTP/1.1 500",
    )
    two = Sample(requests=100, elapsed=2.1, client_cpu=1.8, latencies=[0.003] * 100)
    result = StepResult.combine(4, 8, [one, two], None)
    assert (result.requests, result.errors, result.workers) == (400, 1, 2)
    assert result.elapsed == 2.1
    assert result.throughput == pytest.approx(400 / 2.1)
    assert result.rows_per_s == pytest.approx(8 * 400 / 2.1)
    assert result.latency.p50_ms == pytest.approx(1.0)
    assert result.latency.p99_ms == pytest.approx(3.0)
    assert result.worker_busy == pytest.approx((0.25, 1.8 / 2.1))
    assert result.client_bound  # the second worker was over 80% of a core
    assert result.first_error == "HTTP/1.1 500"
    calm = StepResult.combine(4, 1, [one], None)
    assert not calm.client_bound and calm.busiest_worker == pytest.approx(0.25)
