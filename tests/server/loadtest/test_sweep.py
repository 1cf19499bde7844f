"""The sweep's decisions, on a stand-in worker pool: more client processes while the client is
the limit (automatic workers only), the statistics delta per step, and the response check."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest

from server.loadtest.errors import BenchError
from server.loadtest.measurements import Duration, Sample, ServerCounters
from server.loadtest.progress import SweepProgress
from server.loadtest.sweep import Sweep, SweepPlan

OK = b"HTTP/1.1 200 OK"


class FakePool:
    """Each worker with slots reports ``cpu_per_slot`` CPU seconds per slot per second (so
    more workers means less busy ones) and 100 requests per slot per second."""

    def __init__(self, size: int, cpu_per_slot: float, response: bytes = OK) -> None:
        self.size = size
        self.cpu_per_slot = cpu_per_slot
        self.response = response
        self.slots: list[int] = []
        self.opened: list[list[int]] = []
        self.phases: list[float] = []
        self.on_run: Callable[[], None] = lambda: None

    def grow(self, count: int = 1) -> None:
        self.size += count

    def open(self, slots: Sequence[int]) -> None:
        assert len(slots) == self.size
        self.slots = [n for n in slots if n > 0]
        self.opened.append(list(slots))

    def run(
        self, seconds: float, max_requests: int | None, tick: Callable[[], None]
    ) -> list[Sample]:
        tick()
        self.phases.append(seconds)
        self.on_run()
        return [
            Sample(
                requests=100 * n,
                elapsed=seconds,
                client_cpu=self.cpu_per_slot * n * seconds,
                latencies=[0.002] * (100 * n),
                first_response=self.response,
            )
            for n in self.slots
        ]

    def close_connections(self) -> None:
        self.slots = []


def _plan(concurrencies: tuple[int, ...], workers: int | None, max_workers: int = 8) -> SweepPlan:
    return SweepPlan(concurrencies, 1.0, 0.5, None, workers, max_workers)


def _check(raw: bytes) -> list[str]:
    return [] if raw.startswith(OK) else [raw.decode()]


def _sweep(pool: FakePool, plan: SweepPlan, counters: Callable[[], ServerCounters | None]) -> Sweep:
    return Sweep(pool, plan, 1, counters, _check, SweepProgress(10, enabled=False))


def test_automatic_workers_grow_until_no_client_process_is_too_busy() -> None:
    pool = FakePool(1, cpu_per_slot=0.3)  # one process: 0.3 per slot, over 0.8 from 3 slots
    results = _sweep(pool, _plan((1, 2, 6), None), lambda: None).run()
    assert [r.concurrency for r in results] == [1, 2, 6]
    assert [r.workers for r in results] == [1, 1, 3]
    assert not any(r.client_bound for r in results)
    # concurrency 6 was measured with 1, then 2 (3 slots each: 0.9), then 3 processes
    assert pool.opened[-3:] == [[6], [3, 3], [2, 2, 2]]
    assert results[-1].requests == 600 and results[-1].worker_busy == pytest.approx((0.6,) * 3)
    assert pool.phases == [0.5, 1.0] * 5  # warm-up then measurement, every time


def test_automatic_workers_stop_at_the_limit_and_flag_the_step() -> None:
    pool = FakePool(1, cpu_per_slot=0.9)
    (result,) = _sweep(pool, _plan((4,), None, max_workers=2), lambda: None).run()
    assert pool.size == 2
    assert result.workers == 2 and result.client_bound


def test_fixed_workers_are_kept_and_client_bound_steps_flagged() -> None:
    pool = FakePool(1, cpu_per_slot=0.3)
    results = _sweep(pool, _plan((1, 4), 1), lambda: None).run()
    assert pool.size == 1
    assert [r.client_bound for r in results] == [False, True]


def test_server_breakdown_is_the_delta_over_the_measurement() -> None:
    pool = FakePool(1, cpu_per_slot=0.01)
    readings = [
        ServerCounters(10, 10, Duration(10, 10_000)),  # before
        ServerCounters(110, 60, Duration(110, 210_000), queue=Duration(100, 50_000)),  # after
        ServerCounters(110, 60, Duration(110, 210_000)),
        ServerCounters(400, 100, Duration(400, 400_000)),  # 290 served, 200 sent: others too
    ]
    sweep = _sweep(pool, _plan((1, 2), 1), lambda: readings.pop(0))
    first, second = sweep.run()
    assert first.server is not None and first.server.requests == 100 == first.requests
    assert first.server.request_us == pytest.approx(2.0)
    assert first.server.queue_us == pytest.approx(0.5)
    assert first.server.avg_batch_size == pytest.approx(2.0)
    assert second.server is not None and second.server.requests == 290
    (note,) = sweep.notes
    assert "concurrency 2" in note and "other clients" in note


def test_without_statistics_there_is_no_breakdown() -> None:
    (result,) = _sweep(FakePool(1, 0.01), _plan((1,), 1), lambda: None).run()
    assert result.server is None and result.requests == 100


def test_a_refused_request_ends_the_sweep() -> None:
    pool = FakePool(1, 0.01, response=b"HTTP/1.1 400 Bad Request")
    sweep = _sweep(pool, _plan((1, 2), 1), lambda: None)
    with pytest.raises(BenchError, match="concurrency 1: the server's response is not a success"):
        sweep.run()
    assert sweep.results == []
