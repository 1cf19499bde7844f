"""The manifests against a real tensorgate: their launch lines serve the example repository, and
every metric name the dashboard and the autoscalers read is one a server exports.

Servers run as subprocesses on free ports (``local_argv`` swaps the manifests' fixed ports and
model path for free ports and ``examples/model_repository``). GPU metrics only appear where
NVML sees a GPU, so their names are taken from the metrics renderer itself, fed one GPU sample.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from server.observability.gpu_metrics import GpuSample
from server.observability.metrics import SystemSample, render
from tests.deploy.manifests import (
    TARGET_LABELS,
    assert_serves_examples,
    by_kind,
    local_argv,
    needs_helm,
    one,
    parse_promql,
    render_chart,
    simple_infer_body,
    started,
)
from tests.deploy.test_grafana import dashboard_queries, label_values_metric
from tests.deploy.test_helm_chart import TOGGLES
from tests.deploy.test_kserve import _container as kserve_container
from tests.server_process import EXAMPLES, ServerProcess, start_server

Exported = dict[str, set[str]]  # sample name -> the label names it carries


_SAMPLE = re.compile(r"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+")


def _exported(page: str) -> Exported:
    """Sample names and their label names, as Prometheus stores them from the text format
    (prometheus_client's parser would add ``_total`` to counters; Prometheus does not)."""
    names: Exported = {}
    for line in page.splitlines():
        if line.startswith("#") or not line:
            continue
        match = _SAMPLE.fullmatch(line)
        assert match, line
        labels = set(re.findall(r'(\w+)="', match.group(2) or ""))
        names.setdefault(match.group(1), set()).update(labels)
    return names


@pytest.fixture(scope="module")
def exported() -> Iterator[Exported]:
    """What a server with latency histograms exports once a request has been answered, plus
    the GPU series as the renderer writes them for one GPU."""
    server = start_server(EXAMPLES, args=("--metrics-config=histogram_latencies=true",))
    try:
        assert server.port is not None, server.log
        status, _, body = server.request("POST", "/v2/models/simple/infer", simple_infer_body())
        assert status == 200, body
        names = _exported(server.metrics())
    finally:
        server.stop()
    gpu = GpuSample(
        index=0, uuid="GPU-00000000-0000-0000-0000-000000000000", name="test GPU",
        utilization=0.5, memory_used_bytes=1 << 30, memory_total_bytes=80 << 30,
        power_usage_watts=100.0, power_limit_watts=700.0, energy_joules=10.0,
        energy_since_start_joules=1.0,
    )
    gpu_names = _exported(render([], None, SystemSample(gpus=[gpu])))
    assert gpu_names and all(n.startswith(("nv_gpu_", "nv_energy_")) for n in gpu_names)
    assert not set(gpu_names) & set(names), "this machine has no GPU; names must not clash"
    yield {**names, **gpu_names}


def _assert_exported(expr: str, exported: Exported) -> None:
    query = parse_promql(expr)
    missing = query.metrics - set(exported)
    assert not missing, f"{expr} reads series tensorgate does not export: {missing}"
    labels = set().union(*(exported[m] for m in query.metrics)) | TARGET_LABELS
    assert query.labels <= labels, f"{expr} uses labels no series has: {query.labels - labels}"


@pytest.mark.parametrize(
    "expr", [e for e in dashboard_queries() if not e.startswith("label_values(")]
)
def test_dashboard_metrics_are_exported(expr: str, exported: Exported) -> None:
    _assert_exported(expr, exported)


def test_dashboard_variable_metric_is_exported(exported: Exported) -> None:
    for expr in dashboard_queries():
        if expr.startswith("label_values("):
            metric, label = label_values_metric(expr)
            assert label in exported[metric], expr


def test_every_exported_per_model_series_is_on_the_dashboard(exported: Exported) -> None:
    """The counters a Triton dashboard reads are all here (load time and the CPU gauges are
    the ones left out)."""
    read = set().union(*(parse_promql(e).metrics for e in dashboard_queries()
                         if not e.startswith("label_values(")))
    for name in exported:
        family = name.removesuffix("_bucket").removesuffix("_sum").removesuffix("_count")
        if name.endswith(("_sum", "_count")) or family.startswith(("nv_cpu_", "nv_model_load")):
            continue
        if name.startswith(("nv_gpu_power", "nv_energy_")):
            continue
        assert name in read, f"{name} is exported but no panel shows it"


@needs_helm
@pytest.mark.parametrize("toggle", ["keda", "hpa"])
def test_autoscaling_queries_read_exported_series(toggle: str, exported: Exported) -> None:
    objects = render_chart(TOGGLES[toggle])
    if toggle == "keda":
        exprs = [one(objects, "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]]
    else:
        config: dict[str, Any] = yaml.safe_load(one(objects, "ConfigMap")["data"]["config.yaml"])
        exprs = [expr for rule in config["rules"]
                 for expr in (rule["seriesQuery"], rule["metricsQuery"])]
    for expr in exprs:
        _assert_exported(expr, exported)


@pytest.fixture(scope="module")
def kserve_server() -> Iterator[ServerProcess]:
    yield from started(local_argv(kserve_container()["args"]))


def test_kserve_runtime_args_serve_the_examples(kserve_server: ServerProcess) -> None:
    assert_serves_examples(kserve_server)
    assert kserve_server.grpc_port is not None  # --allow-grpc=true
    assert "nv_inference_request_duration_histogram_us_bucket" in kserve_server.metrics()


@pytest.fixture(scope="module")
def chart_server() -> Iterator[ServerProcess]:
    deployment = one(render_chart(), "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    yield from started(local_argv(container["args"]))


@needs_helm
def test_chart_default_args_serve_the_examples(chart_server: ServerProcess) -> None:
    assert_serves_examples(chart_server)
    assert chart_server.grpc_port is not None
    assert "nv_inference_request_duration_histogram_us_bucket" in chart_server.metrics()


@needs_helm
def test_chart_explicit_mode_loads_only_the_named_models() -> None:
    objects = render_chart({"server": {"modelControlMode": "explicit", "loadModels": ["simple"]}})
    (container,) = by_kind(objects, "Deployment")[0]["spec"]["template"]["spec"]["containers"]
    server = ServerProcess(local_argv(container["args"]))
    try:
        assert server.request("GET", "/v2/health/ready")[0] == 200, server.log
        assert server.request("GET", "/v2/models/simple/ready")[0] == 200
        assert server.request("GET", "/v2/models/mlp/ready")[0] != 200
    finally:
        server.stop()
