"""Triton's Prometheus metrics, rendered from the same counters as the statistics extension.

Names, types and labels are Triton's (triton-facts §5.1), so dashboards and alerts built for
Triton work unchanged: per model version (labels ``model``, ``version``) the request, failure
(``reason`` = REJECTED | CANCELED | BACKEND | OTHER), inference and execution counters, the
pending request gauge, cumulative durations in µs and the load time; system-wide the CPU and
pinned-pool gauges; per GPU (label ``gpu_uuid``) NVML's gauges. With
``--metrics-config histogram_latencies=true`` three latency histograms are added
(``nv_inference_{request,queue,compute_infer}_duration_histogram_us``), so that p99 can be
read with ``histogram_quantile`` in Grafana; Triton itself only has summaries and a
first-response histogram for decoupled models.

The text is written here rather than by ``prometheus_client``: its number formatting turns
values of a million or more into exponent notation (``8.16e+10``), which perf_analyzer's GPU
metric regex misreads (triton-facts §0 item 7). Every number is written positionally.

CPU and GPU figures are sampled every ``--metrics-interval-ms`` on a worker thread (NVML calls
block) by ``SystemSampler``; a scrape reads the latest sample and the model counters, on the
event loop, where the counters live.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np
import psutil

from server.logs import RepeatingError
from server.memory.host_pool import PoolStats
from server.observability import custom_metrics
from server.observability.custom_metrics import HISTOGRAM, CustomMetrics
from server.observability.gpu_metrics import GpuMonitor, GpuSample
from server.observability.statistics import (
    FAILURE_REASONS,
    LATENCY_BUCKETS_US,
    LatencyHistogram,
    ModelStats,
)

log = logging.getLogger(__name__)

CONTENT_TYPE = "text/plain; charset=utf-8"

Labels = tuple[tuple[str, str], ...]
_Value = Callable[[ModelStats], float | int]


@dataclass(frozen=True)
class ModelEntry:
    """One loaded model version, as the metrics see it."""

    name: str
    version: str
    stats: ModelStats
    pending: int


@dataclass(frozen=True)
class CacheSample:
    """The response cache's fill at the scrape."""

    entries: int
    utilization: float


@dataclass
class SystemSample:
    """The latest CPU and GPU readings (None: not sampled, or switched off)."""

    cpu_utilization: float | None = None
    cpu_memory_total_bytes: int | None = None
    cpu_memory_used_bytes: int | None = None
    gpus: list[GpuSample] = field(default_factory=list)


class SystemSampler:
    """Samples CPU utilisation and memory (psutil) and the GPUs (NVML) on an interval."""

    def __init__(self, cpu: bool, gpu: GpuMonitor | None) -> None:
        self._cpu = cpu
        self._gpu = gpu
        self.latest = SystemSample()
        # Failing every interval while, say, the process is out of file descriptors.
        self._failures = RepeatingError(log, "sampling CPU/GPU metrics failed", traceback=True)
        if cpu:
            psutil.cpu_percent(interval=None)  # the first call only starts the measurement

    def sample(self) -> SystemSample:
        """Take one reading (blocking: NVML and /proc) and keep it as ``latest``."""
        reading = SystemSample()
        if self._cpu:
            memory = psutil.virtual_memory()
            reading.cpu_utilization = psutil.cpu_percent(interval=None) / 100
            reading.cpu_memory_total_bytes = int(memory.total)
            reading.cpu_memory_used_bytes = int(memory.total - memory.available)
        if self._gpu is not None:
            reading.gpus = self._gpu.sample()
        self.latest = reading
        return reading

    async def run(self, interval_s: float) -> None:
        """Sample every ``interval_s`` until cancelled (the caller took the first reading); a
        failed reading is logged (at most one report per few seconds) and the next one tried."""
        while True:
            await asyncio.sleep(interval_s)
            try:
                await asyncio.to_thread(self.sample)
            except Exception as exc:  # noqa: BLE001 - metrics must never take the server down
                self._failures.report(exc)

    def close(self) -> None:
        if self._gpu is not None:
            self._gpu.close()


def render(
    models: Iterable[ModelEntry],
    pinned: PoolStats | None,
    system: SystemSample,
    histograms: bool = False,
    latency_counters: bool = True,
    custom: CustomMetrics | None = None,
    cache: CacheSample | None = None,
) -> str:
    """The whole ``/metrics`` page; ``latency_counters`` off leaves out the cumulative
    ``*_duration_us`` counters (Triton's ``--metrics-config counter_latencies=false``).
    With a response cache (``cache``) its families follow the model families.
    The families models defined (``custom``, by default the process's) come last."""
    entries = list(models)
    page = _Page()
    per_model: list[tuple[str, str, str, _Value]] = [
        ("nv_inference_request_success", "counter",
         "Number of successful inference requests, all batch sizes",
         lambda s: s.success.count),
        ("nv_inference_count", "counter",
         "Number of inferences performed (a batch of n counts n)",
         lambda s: s.inference_count),
        ("nv_inference_exec_count", "counter",
         "Number of model executions performed (batches)",
         lambda s: s.execution_count),
        ("nv_inference_request_duration_us", "counter",
         "Cumulative inference request duration in microseconds",
         lambda s: s.success.ns // 1_000),  # successes only, as Triton
        ("nv_inference_queue_duration_us", "counter",
         "Cumulative inference queuing duration in microseconds",
         lambda s: s.queue.ns // 1_000),
        ("nv_inference_compute_input_duration_us", "counter",
         "Cumulative compute input duration in microseconds",
         lambda s: s.compute_input.ns // 1_000),
        ("nv_inference_compute_infer_duration_us", "counter",
         "Cumulative compute inference duration in microseconds",
         lambda s: s.compute_infer.ns // 1_000),
        ("nv_inference_compute_output_duration_us", "counter",
         "Cumulative inference compute output duration in microseconds",
         lambda s: s.compute_output.ns // 1_000),
        ("nv_model_load_duration_secs", "gauge",
         "Model load time in seconds",
         lambda s: s.load_ns / 1e9),
    ]
    for name, kind, text, value in per_model:
        if latency_counters or not name.endswith("_duration_us"):
            page.family(name, kind, text, [(_model_labels(e), value(e.stats)) for e in entries])
    page.family(
        "nv_inference_request_failure",
        "counter",
        "Number of failed inference requests, all batch sizes",
        [
            ((("model", e.name), ("reason", reason), ("version", e.version)), e.stats.failures[reason])
            for e in entries
            for reason in FAILURE_REASONS
        ],
    )
    page.family(
        "nv_inference_pending_request_count",
        "gauge",
        "Instantaneous number of pending requests awaiting execution per-model.",
        [(_model_labels(e), e.pending) for e in entries],
    )
    if histograms:
        histogram_families: list[tuple[str, str, Callable[[ModelStats], LatencyHistogram]]] = [
            ("nv_inference_request_duration_histogram_us", "Request duration",
             lambda s: s.request_histogram),
            ("nv_inference_queue_duration_histogram_us", "Queue duration",
             lambda s: s.queue_histogram),
            ("nv_inference_compute_infer_duration_histogram_us", "Compute infer duration",
             lambda s: s.compute_infer_histogram),
        ]
        for name, text, pick in histogram_families:
            page.histogram(
                name, f"{text} in microseconds", [(_model_labels(e), pick(e.stats)) for e in entries]
            )
    if cache is not None:
        _cache(page, entries, cache)
    _system(page, pinned, system)
    _custom(page, custom_metrics.REGISTRY if custom is None else custom)
    return page.text()


def _cache(page: _Page, entries: Sequence[ModelEntry], cache: CacheSample) -> None:
    """Triton's response cache families: per model version hits and misses with their
    durations (µs), and the local cache's fill."""
    per_model: list[tuple[str, str, _Value]] = [
        ("nv_cache_num_hits_per_model", "Number of cache hits per model",
         lambda s: s.cache_hit.count),
        ("nv_cache_hit_duration_per_model",
         "Total cache hit duration per model, in microseconds",
         lambda s: s.cache_hit.ns // 1_000),
        ("nv_cache_num_misses_per_model", "Number of cache misses per model",
         lambda s: s.cache_miss.count),
        ("nv_cache_miss_duration_per_model",
         "Total cache miss (insert + lookup) duration per model, in microseconds",
         lambda s: s.cache_miss.ns // 1_000),
    ]
    for name, text, value in per_model:
        page.family(name, "counter", text, [(_model_labels(e), value(e.stats)) for e in entries])
    page.family("nv_cache_num_entries", "gauge",
                "Number of responses stored in response cache", [((), cache.entries)])
    page.family("nv_cache_util", "gauge",
                "Cache utilization [0.0 - 1.0]", [((), cache.utilization)])


def _custom(page: _Page, registry: CustomMetrics) -> None:
    for family in registry.snapshot():
        family.description = family.description.replace("\\", "\\\\").replace("\n", "\\n")
        if family.kind != HISTOGRAM:
            page.family(
                family.name, family.kind, family.description,
                [(sample.labels, sample.value) for sample in family.samples],
            )
            continue
        page.custom_histogram(family)


def _system(page: _Page, pinned: PoolStats | None, system: SystemSample) -> None:
    if pinned is not None:
        page.family("nv_pinned_memory_pool_total_bytes", "gauge",
                    "Pinned memory pool total memory size, in bytes", [((), pinned.pinned_limit)])
        page.family("nv_pinned_memory_pool_used_bytes", "gauge",
                    "Pinned memory pool used memory size, in bytes", [((), pinned.pinned_used)])
    if system.cpu_utilization is not None:
        page.family("nv_cpu_utilization", "gauge",
                    "CPU utilization rate [0.0 - 1.0]", [((), system.cpu_utilization)])
        page.family("nv_cpu_memory_total_bytes", "gauge",
                    "CPU total memory (RAM), in bytes", [((), system.cpu_memory_total_bytes)])
        page.family("nv_cpu_memory_used_bytes", "gauge",
                    "CPU used memory (RAM), in bytes", [((), system.cpu_memory_used_bytes)])
    gpus = system.gpus
    if not gpus:
        return
    gpu_families: list[tuple[str, str, str, Callable[[GpuSample], float | None]]] = [
        ("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)",
         lambda g: g.utilization),
        ("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes",
         lambda g: g.memory_total_bytes),
        ("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes",
         lambda g: g.memory_used_bytes),
        ("nv_gpu_power_usage", "gauge", "GPU power usage in watts",
         lambda g: g.power_usage_watts),
        ("nv_gpu_power_limit", "gauge", "GPU power management limit in watts",
         lambda g: g.power_limit_watts),
        ("nv_energy_consumption", "counter",
         "GPU energy consumption in joules since the Triton Server started",
         lambda g: g.energy_since_start_joules),
    ]
    for name, kind, text, pick in gpu_families:
        samples = [((("gpu_uuid", g.uuid),), pick(g)) for g in gpus]
        page.family(name, kind, text, [(labels, v) for labels, v in samples if v is not None])


def _model_labels(entry: ModelEntry) -> Labels:
    return (("model", entry.name), ("version", entry.version))


class _Page:
    """Prometheus text exposition format 0.0.4, numbers always positional."""

    def __init__(self) -> None:
        self._lines: list[str] = []

    def family(
        self, name: str, kind: str, text: str, samples: Sequence[tuple[Labels, float | int | None]]
    ) -> None:
        if not samples:
            return
        self._lines += [f"# HELP {name} {text}", f"# TYPE {name} {kind}"]
        for labels, value in samples:
            if value is not None:
                self._lines.append(f"{name}{_labels(labels)} {_number(value)}")

    def histogram(
        self, name: str, text: str, samples: Sequence[tuple[Labels, LatencyHistogram]]
    ) -> None:
        if not samples:
            return
        self._lines += [f"# HELP {name} {text}", f"# TYPE {name} histogram"]
        for labels, histogram in samples:
            cumulative = 0
            bounds = [*(_number(b) for b in LATENCY_BUCKETS_US), "+Inf"]
            for bound, count in zip(bounds, histogram.counts, strict=True):
                cumulative += count
                self._lines.append(f"{name}_bucket{_labels((*labels, ('le', bound)))} {cumulative}")
            self._lines.append(f"{name}_sum{_labels(labels)} {_number(histogram.sum_us)}")
            self._lines.append(f"{name}_count{_labels(labels)} {cumulative}")

    def custom_histogram(self, family: custom_metrics.FamilySnapshot) -> None:
        """A model's histogram: its own buckets per series."""
        if not family.samples:
            return
        name = family.name
        self._lines += [f"# HELP {name} {family.description}", f"# TYPE {name} histogram"]
        for sample in family.samples:
            cumulative = 0
            bounds = [*(_number(b) for b in sample.buckets), "+Inf"]
            for bound, count in zip(bounds, sample.counts, strict=True):
                cumulative += count
                labels = (*sample.labels, ("le", bound))
                self._lines.append(f"{name}_bucket{_labels(labels)} {cumulative}")
            self._lines.append(f"{name}_sum{_labels(sample.labels)} {_number(sample.value)}")
            self._lines.append(f"{name}_count{_labels(sample.labels)} {cumulative}")

    def text(self) -> str:
        return "\n".join(self._lines) + "\n" if self._lines else ""


def _labels(labels: Labels) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{key}="{_escape(value)}"' for key, value in labels)
    return "{" + inner + "}"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _number(value: float) -> str:
    """A sample value without exponent notation (perf_analyzer reads ``\\d+\\.?\\d*``)."""
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value.is_integer():
        return str(int(value))
    return np.format_float_positional(value, trim="-")
