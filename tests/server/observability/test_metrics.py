"""The /metrics page as text: Triton's families and labels, numbers never in exponent
notation, histograms cumulative, and all of it readable by prometheus_client's parser."""

from __future__ import annotations

import asyncio
import logging
import re

import pytest
from prometheus_client.parser import text_string_to_metric_families

from server import event_loop
from server.memory.host_pool import PoolStats
from server.observability.gpu_metrics import GpuSample
from server.observability.metrics import (
    CacheSample,
    ModelEntry,
    SystemSample,
    SystemSampler,
    render,
)
from server.observability.statistics import ModelStats

GPU = GpuSample(
    index=0,
    uuid="GPU-1234",
    name="Fake",
    utilization=0.5,
    memory_used_bytes=81_604_378_624,
    memory_total_bytes=150_000_000_000,
    power_usage_watts=123.456,
    power_limit_watts=700.0,
    energy_joules=5_000_000.25,
    energy_since_start_joules=1_234_567.5,
)
SYSTEM = SystemSample(0.25, 64 << 30, 10 << 30, [GPU])
POOL = PoolStats(256 << 20, 2 << 20, 1 << 20, 0, 1 << 20, 3, 4, 0)


def _stats() -> ModelStats:
    stats = ModelStats(clock=lambda: 0)
    stats.record_success(2_000_000, 300_000, 10_000, 1_500_000, 20_000, 2)
    stats.record_success(40_000_000, 35_000_000, 10_000, 4_000_000, 20_000, 1)
    stats.record_execution(3, 10_000, 4_000_000, 20_000)
    stats.record_failure(1_000, "REJECTED")
    stats.record_failure(2_000, "BACKEND")
    stats.record_failure(3_000, "nonsense")  # unknown reasons count as OTHER
    stats.load_ns = 1_500_000_000
    return stats


def _page(histograms: bool = False) -> str:
    entries = [ModelEntry("m", "1", _stats(), 5), ModelEntry('we"ird', "2", ModelStats(), 0)]
    return render(entries, POOL, SYSTEM, histograms)


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def test_every_family_with_tritons_labels_and_values() -> None:
    samples = _samples(_page())
    m = (("model", "m"), ("version", "1"))
    assert samples[("nv_inference_request_success_total", m)] == 2
    assert samples[("nv_inference_count_total", m)] == 3
    assert samples[("nv_inference_exec_count_total", m)] == 1
    assert samples[("nv_inference_pending_request_count", m)] == 5
    assert samples[("nv_inference_request_duration_us_total", m)] == 42_000_000 // 1000
    assert samples[("nv_inference_queue_duration_us_total", m)] == 35_300
    assert samples[("nv_inference_compute_infer_duration_us_total", m)] == 5_500
    assert samples[("nv_inference_compute_input_duration_us_total", m)] == 20
    assert samples[("nv_inference_compute_output_duration_us_total", m)] == 40
    assert samples[("nv_model_load_duration_secs", m)] == 1.5
    for reason, count in (("REJECTED", 1), ("BACKEND", 1), ("OTHER", 1), ("CANCELED", 0)):
        key = (("model", "m"), ("reason", reason), ("version", "1"))
        assert samples[("nv_inference_request_failure_total", key)] == count
    assert samples[("nv_inference_request_success_total", (("model", 'we"ird'), ("version", "2")))] == 0
    assert samples[("nv_cpu_utilization", ())] == 0.25
    assert samples[("nv_cpu_memory_total_bytes", ())] == 64 << 30
    assert samples[("nv_pinned_memory_pool_total_bytes", ())] == 256 << 20
    assert samples[("nv_pinned_memory_pool_used_bytes", ())] == 1 << 20
    gpu = (("gpu_uuid", "GPU-1234"),)
    assert samples[("nv_gpu_utilization", gpu)] == 0.5
    assert samples[("nv_gpu_memory_used_bytes", gpu)] == 81_604_378_624
    assert samples[("nv_gpu_power_usage", gpu)] == 123.456
    assert samples[("nv_energy_consumption_total", gpu)] == 1_234_567.5


def test_no_exponent_notation_anywhere() -> None:
    """perf_analyzer reads GPU values with ``\\d+\\.?\\d*``: 8.16e+10 would read as 8.16."""
    text = _page(histograms=True)
    for line in text.splitlines():
        if not line.startswith("#"):
            assert re.fullmatch(r"\S+ (-?\d+(\.\d+)?|NaN|[+-]Inf)", line), line
    assert 'nv_gpu_memory_used_bytes{gpu_uuid="GPU-1234"} 81604378624\n' in text
    match = re.search(r'\nnv_gpu_utilization\{gpu_uuid="([^"]+)"\} (\d+\.?\d*)', text)
    assert match and match.groups() == ("GPU-1234", "0.5")


def test_label_values_are_escaped() -> None:
    assert 'model="we\\"ird"' in _page()


def test_histograms_only_when_asked_and_cumulative() -> None:
    assert "histogram" not in _page()
    families = {f.name: f for f in text_string_to_metric_families(_page(histograms=True))}
    family = families["nv_inference_request_duration_histogram_us"]
    assert family.type == "histogram"
    buckets = [
        (s.labels["le"], s.value)
        for s in family.samples
        if s.name.endswith("_bucket") and s.labels["model"] == "m"
    ]
    counts = [value for _, value in buckets]
    assert counts == sorted(counts), "buckets are cumulative"
    assert dict(buckets)["2500"] == 1  # the 2 ms request
    assert dict(buckets)["50000"] == 2  # and the 40 ms one
    assert buckets[-1] == ("+Inf", 2)
    total = [s.value for s in family.samples if s.name.endswith("_sum") and s.labels["model"] == "m"]
    assert total == [42_000.0]


def test_latency_counters_can_be_left_out() -> None:
    """--metrics-config counter_latencies=false: no cumulative *_duration_us counters, the
    others stay."""
    entries = [ModelEntry("m", "1", _stats(), 5)]
    names = {f.name for f in text_string_to_metric_families(render(entries, POOL, SYSTEM))}
    kept = {
        f.name for f in text_string_to_metric_families(
            render(entries, POOL, SYSTEM, latency_counters=False)
        )
    }
    latency = {
        "nv_inference_request_duration_us", "nv_inference_queue_duration_us",
        "nv_inference_compute_input_duration_us", "nv_inference_compute_infer_duration_us",
        "nv_inference_compute_output_duration_us",
    }
    assert latency <= names
    assert kept == names - latency
    assert "nv_inference_request_success" in kept


def test_empty_server_renders_system_gauges_only() -> None:
    text = render([], None, SystemSample(), False)
    assert text == ""
    text = render([], POOL, SystemSample(), False)
    assert "nv_pinned_memory_pool_total_bytes 268435456" in text
    assert "nv_inference" not in text


def test_a_sampler_that_keeps_failing_is_reported_once_per_interval(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Out of file descriptors, psutil fails on every reading: the log gets one report, not
    one per reading."""
    sampler = SystemSampler(cpu=False, gpu=None)

    def fail() -> SystemSample:
        raise OSError(24, "Too many open files: '/proc/meminfo'")

    monkeypatch.setattr(sampler, "sample", fail)

    async def run_a_while() -> None:
        task = asyncio.create_task(sampler.run(0.001))
        await asyncio.sleep(0.2)
        task.cancel()

    with caplog.at_level(logging.ERROR, logger="server.observability.metrics"):
        event_loop.run(run_a_while())
    (record,) = caplog.records
    assert record.getMessage().startswith("sampling CPU/GPU metrics failed: [Errno 24]")
    assert record.exc_info is not None


def test_cache_families_only_with_a_cache() -> None:
    assert "nv_cache_" not in _page()
    stats = _stats()
    stats.record_cache_hit(50_000, 1_000, 7_000)
    stats.record_cache_miss(3_000)
    stats.record_cache_miss(4_500)
    text = render([ModelEntry("m", "1", stats, 0)], POOL, SYSTEM, cache=CacheSample(4, 0.125))
    samples = _samples(text)
    m = (("model", "m"), ("version", "1"))
    assert samples[("nv_cache_num_hits_per_model_total", m)] == 1
    assert samples[("nv_cache_hit_duration_per_model_total", m)] == 7
    assert samples[("nv_cache_num_misses_per_model_total", m)] == 2
    assert samples[("nv_cache_miss_duration_per_model_total", m)] == 7
    assert samples[("nv_cache_num_entries", ())] == 4
    assert samples[("nv_cache_util", ())] == 0.125
    # the hit is a success, not an inference or an execution
    assert samples[("nv_inference_request_success_total", m)] == 3
    assert samples[("nv_inference_count_total", m)] == 3
    assert samples[("nv_inference_exec_count_total", m)] == 1
