"""deploy/grafana/tensorgate.json: a dashboard Grafana can import, whose queries parse.

Whether the metric names it reads are the ones tensorgate exports is checked against a running
server in test_live_server.py.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from itertools import combinations
from typing import Any

import pytest

from tests.deploy.manifests import DASHBOARD, parse_promql

GRID_WIDTH = 24
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Series that carry model and version labels, which the $model variable filters.
PER_MODEL_PREFIXES = ("nv_inference_", "nv_model_")


def _dashboard() -> dict[str, Any]:
    with DASHBOARD.open(encoding="utf-8") as file:
        dashboard: dict[str, Any] = json.load(file)
    return dashboard


def _all_panels(panels: list[dict[str, Any]]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        yield panel
        yield from _all_panels(panel.get("panels", []))  # a collapsed row holds its panels


def dashboard_queries() -> list[str]:
    """Every PromQL expression of the dashboard: panel targets and the query variables."""
    dashboard = _dashboard()
    exprs = [t["expr"] for p in _all_panels(dashboard["panels"]) for t in p.get("targets", [])]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            query = variable["query"]
            exprs.append(query["query"] if isinstance(query, dict) else query)
    return exprs


def label_values_metric(query: str) -> tuple[str, str]:
    """``label_values(metric, label)`` (Grafana's variable query, not PromQL) split up."""
    inner = query.removeprefix("label_values(").removesuffix(")")
    metric, label = (part.strip() for part in inner.split(","))
    return metric, label


def test_top_level() -> None:
    dashboard = _dashboard()
    assert dashboard["uid"] == "tensorgate" and dashboard["title"]
    assert isinstance(dashboard["schemaVersion"], int) and dashboard["schemaVersion"] >= 36
    assert "id" not in dashboard or dashboard["id"] is None  # Grafana assigns it on import
    assert dashboard["panels"]


def test_panel_ids_are_unique() -> None:
    ids = [p["id"] for p in _all_panels(_dashboard()["panels"])]
    assert all(isinstance(i, int) and i > 0 for i in ids)
    assert len(ids) == len(set(ids))


def test_grid_positions_are_valid_and_do_not_overlap() -> None:
    panels = _dashboard()["panels"]
    boxes = []
    for panel in panels:
        grid = panel["gridPos"]
        assert set(grid) == {"x", "y", "w", "h"}, panel["title"]
        assert all(isinstance(v, int) for v in grid.values()), panel["title"]
        assert grid["x"] >= 0 and grid["y"] >= 0 and grid["w"] >= 1 and grid["h"] >= 1
        assert grid["x"] + grid["w"] <= GRID_WIDTH, panel["title"]
        if panel["type"] == "row":
            assert (grid["x"], grid["w"], grid["h"]) == (0, GRID_WIDTH, 1)
        boxes.append((panel["title"], grid))
    for (a, p), (b, q) in combinations(boxes, 2):
        apart = (p["x"] + p["w"] <= q["x"] or q["x"] + q["w"] <= p["x"]
                 or p["y"] + p["h"] <= q["y"] or q["y"] + q["h"] <= p["y"])
        assert apart, f"panels {a!r} and {b!r} overlap"


def test_variables() -> None:
    variables = {v["name"]: v for v in _dashboard()["templating"]["list"]}
    assert set(variables) == {"datasource", "model"}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    model = variables["model"]
    assert model["type"] == "query" and model["datasource"] == DATASOURCE
    assert model["multi"] is True and model["includeAll"] is True and model["allValue"] == ".*"
    metric, label = label_values_metric(model["query"]["query"])
    assert label == "model" and metric.startswith(PER_MODEL_PREFIXES)
    assert model["definition"] == model["query"]["query"]


def test_panels_read_the_datasource_variable() -> None:
    for panel in _all_panels(_dashboard()["panels"]):
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == DATASOURCE, panel["title"]
        assert panel["targets"], panel["title"]
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert len(ref_ids) == len(set(ref_ids)), panel["title"]
        for target in panel["targets"]:
            assert target["datasource"] == DATASOURCE, panel["title"]
        assert panel["fieldConfig"]["defaults"]["unit"], panel["title"]


@pytest.mark.parametrize(
    "expr",
    [e for e in dashboard_queries() if not e.startswith("label_values(")],
)
def test_queries_parse_and_filter_by_model(expr: str) -> None:
    query = parse_promql(expr)
    assert query.metrics and all(m.startswith("nv_") for m in query.metrics)
    for metric, matchers in query.selectors:
        # parse_promql fills in $model as .*: a per-model series must be filtered by it.
        per_model = metric.startswith(PER_MODEL_PREFIXES)
        assert ('model=~".*"' in matchers) == per_model, (metric, expr)


def test_the_panels_the_issue_asks_for() -> None:
    exprs = "\n".join(dashboard_queries())
    for needle in (
        "rate(nv_inference_request_success",
        "rate(nv_inference_request_failure",
        "by (model, reason)",
        "histogram_quantile(0.5,",
        "histogram_quantile(0.99,",
        "nv_inference_request_duration_histogram_us_bucket",
        "nv_inference_queue_duration_us",
        "nv_inference_compute_infer_duration_us",
        "nv_inference_pending_request_count",
        "rate(nv_inference_exec_count",
        "nv_pinned_memory_pool_used_bytes",
        "nv_gpu_utilization",
        "nv_gpu_memory_used_bytes",
    ):
        assert needle in exprs, needle
