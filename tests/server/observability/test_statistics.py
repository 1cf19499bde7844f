"""Unit tests for server.observability.statistics: Triton's counters and their JSON form."""

from __future__ import annotations

import json
from typing import Any

from server.generated import grpc_service_pb2 as pb
from server.observability.statistics import (
    Duration,
    ModelStats,
    statistics_json,
    statistics_response,
)
from tests.server.observability.stats_fields import DURATIONS, PERF_ANALYZER_DURATIONS


class FakeClock:
    """Wall-clock nanoseconds the test moves by hand."""

    def __init__(self, ns: int = 0) -> None:
        self.ns = ns

    def __call__(self) -> int:
        return self.ns


def _json(stats: ModelStats, name: str = "m", version: str = "1") -> dict[str, Any]:
    data = statistics_json(statistics_response([(name, version, stats)]))
    # What goes on the wire: a JSON round trip must not change it.
    assert json.loads(json.dumps(data)) == data
    entries: list[dict[str, Any]] = data["model_stats"]
    assert len(entries) == 1
    return entries[0]


def _is_uint(value: object) -> bool:
    return type(value) is int and value >= 0


# ---- Duration ------------------------------------------------------------------------------


def test_duration_add() -> None:
    duration = Duration()
    duration.add(5)
    duration.add(7)
    assert (duration.count, duration.ns) == (2, 12)


def test_duration_negative_counts_as_zero() -> None:
    duration = Duration()
    duration.add(-3)
    assert (duration.count, duration.ns) == (1, 0)


# ---- JSON shape ----------------------------------------------------------------------------


def test_fresh_stats_json_is_complete_and_zero() -> None:
    entry = _json(ModelStats(clock=FakeClock()))
    zero = {"count": 0, "ns": 0}
    assert entry == {
        "name": "m",
        "version": "1",
        "last_inference": 0,
        "inference_count": 0,
        "execution_count": 0,
        "inference_stats": {key: zero for key in DURATIONS},
        "batch_stats": [],
        "memory_usage": [],
        "response_stats": {},
    }


def test_every_key_perf_analyzer_reads_is_an_int() -> None:
    stats = ModelStats(clock=FakeClock(1_700_000_000_123_456_789))
    stats.record_success(100, 10, 1, 2, 3, batch_size=1)
    stats.record_execution(1, 1, 2, 3)
    for entry in (_json(stats), _json(ModelStats(clock=FakeClock()))):
        assert isinstance(entry["name"], str)
        assert isinstance(entry["version"], str)
        for key in ("last_inference", "inference_count", "execution_count"):
            assert _is_uint(entry[key]), key
        for key in PERF_ANALYZER_DURATIONS:
            duration = entry["inference_stats"][key]
            assert _is_uint(duration["count"]), key
            assert _is_uint(duration["ns"]), key
        for batch in entry["batch_stats"]:
            assert _is_uint(batch["batch_size"])
            for key in ("compute_input", "compute_infer", "compute_output"):
                assert _is_uint(batch[key]["count"])
                assert _is_uint(batch[key]["ns"])


def test_several_entries_keep_their_order() -> None:
    first, second = ModelStats(), ModelStats()
    second.record_failure(5)
    data = statistics_json(statistics_response([("b", "2", first), ("a", "1", second)]))
    assert [(e["name"], e["version"]) for e in data["model_stats"]] == [("b", "2"), ("a", "1")]
    assert data["model_stats"][1]["inference_stats"]["fail"] == {"count": 1, "ns": 5}


def test_empty_response() -> None:
    assert statistics_json(statistics_response([])) == {"model_stats": []}


def test_large_counters_stay_exact_numbers() -> None:
    stats = ModelStats(clock=FakeClock())
    big = 2**62 + 1  # past what a double holds exactly
    stats.record_success(big, 0, 0, 0, 0, batch_size=1)
    assert _json(stats)["inference_stats"]["success"] == {"count": 1, "ns": big}


# ---- counting (Triton's infer_stats.cc semantics) ------------------------------------------


def test_success_counts_per_request() -> None:
    clock = FakeClock(5_000_000_000)
    stats = ModelStats(clock=clock)
    stats.record_success(1000, 100, 10, 20, 30, batch_size=1)
    clock.ns = 7_000_000_999
    stats.record_success(2000, 200, 11, 21, 31, batch_size=3)
    entry = _json(stats)
    infer = entry["inference_stats"]
    assert infer["success"] == {"count": 2, "ns": 3000}
    assert infer["queue"] == {"count": 2, "ns": 300}
    assert infer["compute_input"] == {"count": 2, "ns": 21}
    assert infer["compute_infer"] == {"count": 2, "ns": 41}
    assert infer["compute_output"] == {"count": 2, "ns": 61}
    assert infer["fail"] == {"count": 0, "ns": 0}
    assert infer["cache_hit"] == {"count": 0, "ns": 0}
    assert infer["cache_miss"] == {"count": 0, "ns": 0}
    assert entry["inference_count"] == 4  # samples, not requests
    assert entry["execution_count"] == 0  # only executions count here
    assert entry["last_inference"] == 7000  # ms since the epoch
    assert entry["batch_stats"] == []


def test_failure_counts_only_fail() -> None:
    clock = FakeClock(9_000_000_000)
    stats = ModelStats(clock=clock)
    stats.record_failure(400)
    stats.record_failure(600)
    entry = _json(stats)
    assert entry["inference_stats"]["fail"] == {"count": 2, "ns": 1000}
    for key in DURATIONS:
        if key != "fail":
            assert entry["inference_stats"][key] == {"count": 0, "ns": 0}
    assert entry["inference_count"] == 0
    assert entry["execution_count"] == 0
    assert entry["last_inference"] == 0


def test_dynamic_batch_charges_each_request_the_whole_execution() -> None:
    """Three requests (1 + 2 + 1 samples) run as one execution of batch size 4."""
    stats = ModelStats(clock=FakeClock(1_000_000))
    stats.record_execution(4, 50, 500, 5)
    for samples, request_ns, queue_ns in ((1, 900, 300), (2, 800, 200), (1, 700, 100)):
        stats.record_success(request_ns, queue_ns, 50, 500, 5, batch_size=samples)
    entry = _json(stats)
    infer = entry["inference_stats"]
    assert infer["success"] == {"count": 3, "ns": 2400}
    assert infer["queue"] == {"count": 3, "ns": 600}
    assert infer["compute_input"] == {"count": 3, "ns": 150}
    assert infer["compute_infer"] == {"count": 3, "ns": 1500}
    assert infer["compute_output"] == {"count": 3, "ns": 15}
    assert entry["inference_count"] == 4
    assert entry["execution_count"] == 1
    assert entry["batch_stats"] == [
        {
            "batch_size": 4,
            "compute_input": {"count": 1, "ns": 50},
            "compute_infer": {"count": 1, "ns": 500},
            "compute_output": {"count": 1, "ns": 5},
        }
    ]


def test_batch_stats_per_executed_size_sorted() -> None:
    stats = ModelStats(clock=FakeClock())
    stats.record_execution(8, 1, 2, 3)
    stats.record_execution(1, 10, 20, 30)
    stats.record_execution(8, 4, 5, 6)
    stats.record_execution(2, 7, 8, 9)
    entry = _json(stats)
    assert entry["execution_count"] == 4
    assert [b["batch_size"] for b in entry["batch_stats"]] == [1, 2, 8]
    eight = entry["batch_stats"][2]
    assert eight["compute_input"] == {"count": 2, "ns": 5}
    assert eight["compute_infer"] == {"count": 2, "ns": 7}
    assert eight["compute_output"] == {"count": 2, "ns": 9}
    assert set(eight) == {"batch_size", "compute_input", "compute_infer", "compute_output"}


def test_last_inference_stamped_by_execution_and_never_goes_back() -> None:
    clock = FakeClock(3_000_000_000)
    stats = ModelStats(clock=clock)
    stats.record_execution(1, 0, 0, 0)
    assert stats.last_inference_ms == 3000
    clock.ns = 2_000_000_000  # wall clock stepped back
    stats.record_success(0, 0, 0, 0, 0, batch_size=1)
    assert stats.last_inference_ms == 3000
    clock.ns = 4_500_000_000
    stats.record_success(0, 0, 0, 0, 0, batch_size=1)
    assert stats.last_inference_ms == 4500


def test_default_clock_is_wall_time() -> None:
    stats = ModelStats()
    stats.record_success(1, 0, 0, 0, 0, batch_size=1)
    assert stats.last_inference_ms > 1_600_000_000_000  # after 2020, in ms


# ---- the gRPC message ----------------------------------------------------------------------


def test_to_proto_fills_every_field() -> None:
    stats = ModelStats(clock=FakeClock(2_000_000))
    stats.record_success(9, 8, 7, 6, 5, batch_size=2)
    stats.record_execution(2, 7, 6, 5)
    message = stats.to_proto("m", "3")
    assert message.name == "m"
    assert message.version == "3"
    assert message.last_inference == 2
    assert message.inference_count == 2
    assert message.execution_count == 1
    assert message.HasField("inference_stats")
    for key in DURATIONS:
        assert message.inference_stats.HasField(key), key
    assert message.inference_stats.success == pb.StatisticDuration(count=1, ns=9)
    assert message.inference_stats.cache_miss == pb.StatisticDuration(count=0, ns=0)
    assert len(message.batch_stats) == 1
    assert message.batch_stats[0].batch_size == 2
    assert message.batch_stats[0].compute_infer == pb.StatisticDuration(count=1, ns=6)
    assert len(message.memory_usage) == 0
    assert len(message.response_stats) == 0


def test_response_survives_the_wire() -> None:
    stats = ModelStats(clock=FakeClock())
    stats.record_success(1, 1, 1, 1, 1, batch_size=1)
    response = statistics_response([("m", "1", stats)])
    assert isinstance(response, pb.ModelStatisticsResponse)
    back = pb.ModelStatisticsResponse.FromString(response.SerializeToString())
    assert back == response
    assert back.model_stats[0].inference_stats.success.count == 1


def test_a_cache_hit_is_a_queued_success_without_compute() -> None:
    """Triton 2.51 (triton-features §2.2): hits count in success and queue, not in
    inference_count, execution_count or compute_*; misses only in cache_miss here."""
    clock = FakeClock(9_000_000_000)
    stats = ModelStats(clock=clock)
    stats.record_success(1000, 100, 10, 20, 30, batch_size=2)
    stats.record_cache_miss(40)
    stats.record_cache_hit(500, 5, 60)
    stats.record_cache_hit(700, 7, 80)
    entry = _json(stats)
    infer = entry["inference_stats"]
    assert infer["success"] == {"count": 3, "ns": 2200}
    assert infer["queue"] == {"count": 3, "ns": 112}
    for name in ("compute_input", "compute_infer", "compute_output"):
        assert infer[name]["count"] == 1, name
    assert infer["cache_hit"] == {"count": 2, "ns": 140}
    assert infer["cache_miss"] == {"count": 1, "ns": 40}
    assert entry["inference_count"] == 2
    assert entry["execution_count"] == 0
    assert entry["last_inference"] == 9000
