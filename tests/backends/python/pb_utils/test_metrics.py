"""A python model's own metric families: kinds, labels, misuse, and their lines on /metrics."""

from __future__ import annotations

import pytest

import triton_python_backend_utils as pb_utils
from server.observability import custom_metrics
from server.observability.metrics import SystemSample, render


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> custom_metrics.CustomMetrics:
    registry = custom_metrics.CustomMetrics()
    monkeypatch.setattr(custom_metrics, "REGISTRY", registry)
    return registry


def _page() -> str:
    return render([], None, SystemSample())


def test_counter_gauge_and_histogram_on_the_page() -> None:
    counter = pb_utils.MetricFamily(
        name="requests_seen", description="Requests seen", kind=pb_utils.MetricFamily.COUNTER
    )
    first = counter.Metric(labels={"model": "m", "version": "1"})
    first.increment(2)
    first.increment(3.5)
    assert first.value() == 5.5
    # equal labels: the same series
    counter.Metric(labels={"model": "m", "version": "1"}).increment(1)
    assert first.value() == 6.5
    gauge = pb_utils.MetricFamily("queue_depth", "Depth", pb_utils.MetricFamily.GAUGE).Metric()
    gauge.set(4)
    gauge.increment(-1)
    histogram = pb_utils.MetricFamily(
        "latency_ms", "Latency", pb_utils.MetricFamily.HISTOGRAM
    ).Metric(labels={"m": "x"}, buckets=[1, 10])
    for value in (0.5, 5, 50):
        histogram.observe(value)
    page = _page()
    assert "# TYPE requests_seen counter\n" in page
    assert 'requests_seen{model="m",version="1"} 6.5\n' in page
    assert "# TYPE queue_depth gauge\nqueue_depth 3\n" in page
    assert 'latency_ms_bucket{m="x",le="1"} 1\n' in page
    assert 'latency_ms_bucket{m="x",le="10"} 2\n' in page
    assert 'latency_ms_bucket{m="x",le="+Inf"} 3\n' in page
    assert 'latency_ms_sum{m="x"} 55.5\nlatency_ms_count{m="x"} 3\n' in page


def test_misuse_raises_triton_model_exception() -> None:
    counter = pb_utils.MetricFamily("c_total", "C", pb_utils.MetricFamily.COUNTER).Metric()
    with pytest.raises(pb_utils.TritonModelException, match="cannot be decremented"):
        counter.increment(-1)
    with pytest.raises(pb_utils.TritonModelException, match="gauge only"):
        counter.set(1)
    with pytest.raises(pb_utils.TritonModelException, match="histogram only"):
        counter.observe(1)
    histograms = pb_utils.MetricFamily("h", "H", pb_utils.MetricFamily.HISTOGRAM)
    with pytest.raises(pb_utils.TritonModelException, match="Missing required buckets"):
        histograms.Metric(labels={})
    with pytest.raises(pb_utils.TritonModelException, match="not supported for a histogram"):
        histograms.Metric(buckets=[1.0]).value()
    with pytest.raises(pb_utils.TritonModelException, match="Unexpected buckets"):
        pb_utils.MetricFamily("g", "G", pb_utils.MetricFamily.GAUGE).Metric(buckets=[1])
    with pytest.raises(pb_utils.TritonModelException, match="already exists as a counter"):
        pb_utils.MetricFamily("c_total", "C", pb_utils.MetricFamily.GAUGE)
    with pytest.raises(pb_utils.TritonModelException, match="invalid metric family name"):
        pb_utils.MetricFamily("bad name", "x", pb_utils.MetricFamily.GAUGE)
    with pytest.raises(pb_utils.TritonModelException, match="Labels must be a dictionary"):
        pb_utils.MetricFamily("g2", "G", pb_utils.MetricFamily.GAUGE).Metric(labels=["a"])  # type: ignore[arg-type]


def test_no_families_no_lines() -> None:
    assert _page() == ""
