"""deploy/helm/tensorgate: the chart's files as they are, then as Helm renders them.

The static checks run everywhere. The rendering checks run the helm CLI (see ``manifests``;
``scripts/install_helm.sh`` installs it) with the default values and with each toggle on:
``helm lint --strict``, ``helm template``, every built-in object validated against the
Kubernetes schemas and the ServiceMonitor and ScaledObject against their CRDs' schemas, what
the custom resources refer to, and the server arguments parsed by tensorgate's command line.
"""

from __future__ import annotations

import re
import shlex
import shutil
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from server.cli import parse_settings
from server.settings import Settings
from tests.deploy.crds import validate_crd
from tests.deploy.manifests import (
    CHART,
    NAMESPACE,
    RELEASE,
    RenderError,
    by_kind,
    helm,
    lint_chart,
    needs_helm,
    one,
    parse_promql,
    render_chart,
    render_notes,
    unquoted_quantities,
    validate_k8s,
)
from tests.server_process import ROOT

TEMPLATES = CHART / "templates"
FULLNAME = f"{RELEASE}-tensorgate"
_VALUES_REF = re.compile(r"\.Values((?:\.[A-Za-z_][A-Za-z0-9_]*)+)")


def _values() -> dict[str, Any]:
    with (CHART / "values.yaml").open() as file:
        values: dict[str, Any] = yaml.safe_load(file)
    return values


def _template_texts() -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(TEMPLATES.iterdir()) if p.is_file()}


def _leaf_paths(tree: dict[str, Any], prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    """Every key path ending at a value that is not a non-empty mapping."""
    for key, value in tree.items():
        path = (*prefix, key)
        if isinstance(value, dict) and value:
            yield from _leaf_paths(value, path)
        else:
            yield path


def _image_user() -> int:
    users = re.findall(r"^USER\s+(\S+)\s*$", (ROOT / "Dockerfile.cuda").read_text(), re.MULTILINE)
    return int(users[-1])


# The chart's files --------------------------------------------------------------------------


def test_chart_yaml() -> None:
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["apiVersion"] == "v2"  # Helm 3 and later
    assert chart["name"] == CHART.name == "tensorgate"
    assert chart["type"] == "application"
    assert re.fullmatch(r"\d+\.\d+\.\d+", chart["version"])
    with (ROOT / "pyproject.toml").open("rb") as file:
        assert chart["appVersion"] == tomllib.load(file)["project"]["version"]
    assert chart["kubeVersion"].startswith(">=1.27")
    for name in ("README.md", "values.yaml", ".helmignore", "templates/_helpers.tpl",
                 "templates/NOTES.txt"):
        assert (CHART / name).is_file(), name


def test_values_referenced_exist_and_every_value_is_used() -> None:
    values = _values()
    referenced = {
        tuple(match.group(1).lstrip(".").split("."))
        for text in _template_texts().values()
        for match in _VALUES_REF.finditer(text)
    }
    assert referenced
    for path in sorted(referenced):
        node: Any = values
        for key in path:
            name = ".".join(path)
            assert isinstance(node, dict) and key in node, f".Values.{name} is not in values.yaml"
            node = node[key]
    unused = [
        ".".join(leaf) for leaf in _leaf_paths(values)
        if not any(leaf[: len(ref)] == ref for ref in referenced)
    ]
    assert not unused, f"values.yaml keys no template reads: {unused}"


def test_values_yaml_is_commented() -> None:
    text = (CHART / "values.yaml").read_text()
    top_level = re.findall(r"^([A-Za-z]\w*):", text, re.MULTILINE)
    assert len(top_level) == len(_values())
    commented = sum(1 for line in text.splitlines() if line.lstrip().startswith("#"))
    assert commented >= 40, "values.yaml should say what its settings do"


@pytest.mark.parametrize("name", sorted(_template_texts()))
def test_template_delimiters_balance(name: str) -> None:
    text = _template_texts()[name]
    tokens = re.findall(r"\{\{|\}\}", text)
    assert tokens, name
    expected = "{{"
    for token in tokens:
        assert token == expected, f"{name}: unbalanced template delimiters"
        expected = "}}" if expected == "{{" else "{{"
    assert expected == "{{", f"{name}: an action is not closed"


def test_quantities_in_values_are_quoted() -> None:
    text = (CHART / "values.yaml").read_text()
    assert unquoted_quantities(text, frozenset({"targetQueueTimeUs"})) == []
    values = _values()
    assert values["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert values["shm"]["sizeLimit"]


def test_pod_user_is_the_images_user() -> None:
    context = _values()["podSecurityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == _image_user() != 0


def test_the_readme_documents_the_adapter_rule_the_chart_renders() -> None:
    """The adapter rule is in the README as a snippet; it must be the template's."""
    readme = (CHART / "README.md").read_text()
    snippet = re.search(r"```yaml\n(rules:\n  custom:.*?)```", readme, re.DOTALL)
    assert snippet is not None
    documented = yaml.safe_load(snippet.group(1))["rules"]["custom"]
    assert documented[0]["name"]["as"] == _values()["autoscaling"]["hpa"]["metricName"]
    template = (TEMPLATES / "prometheus-adapter-rules.yaml").read_text()
    assert documented[0]["seriesQuery"] in template
    parse_promql(documented[0]["metricsQuery"])


# The chart as Helm renders it ---------------------------------------------------------------

TOGGLES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "service-monitor": {"metrics": {"serviceMonitor": {"enabled": True,
                                                       "labels": {"release": "kps"}}}},
    "keda": {"autoscaling": {"keda": {"enabled": True}}},
    "hpa": {"autoscaling": {"hpa": {"enabled": True}}},
    "host-path": {"modelRepository": {"source": "hostPath"}},
    "init-container": {"modelRepository": {"source": "initContainer"}},
    "pvc-sub-path": {"modelRepository": {"pvc": {"subPath": "repo", "readOnly": False}}},
    "explicit": {"server": {"modelControlMode": "explicit", "loadModels": ["simple", "mlp"]}},
    "poll": {"server": {"modelControlMode": "poll", "repositoryPollSecs": 30,
                        "extraArgs": ["--log-verbose=1", "--allow-client-shm=true"]}},
    "no-histograms": {"metrics": {"histogramLatencies": False}},
    "everything": {
        "metrics": {"serviceMonitor": {"enabled": True}, "service": {"annotations": {"a": "b"}}},
        "autoscaling": {"keda": {"enabled": True}},
        "modelRepository": {"source": "initContainer"},
        "imagePullSecrets": [{"name": "registry"}],
        "strategy": {"type": "RollingUpdate",
                     "rollingUpdate": {"maxSurge": 0, "maxUnavailable": 1}},
        "runtimeClassName": "nvidia",
        "podAnnotations": {"x": "y"},
        "podLabels": {"team": "ml"},
        "env": [{"name": "CUPY_CACHE_DIR", "value": "/tmp/cupy"}],
        "extraVolumes": [{"name": "tmp", "emptyDir": {}}],
        "extraVolumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],
        "nodeSelector": {"nvidia.com/gpu.present": "true"},
        "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{"matchExpressions": [
                {"key": "gpu", "operator": "In", "values": ["h100"]}]}]}}},
        "service": {"annotations": {"c": "d"}},
    },
}


@pytest.fixture(scope="module", params=sorted(TOGGLES))
def rendered(request: pytest.FixtureRequest) -> tuple[str, list[dict[str, Any]]]:
    return request.param, render_chart(TOGGLES[request.param])


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    containers = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["tensorgate"]
    container: dict[str, Any] = containers[0]
    return container


def _settings(objects: list[dict[str, Any]]) -> Settings:
    container = _container(objects)
    assert "command" not in container, "the image's entrypoint (tensorgate) must stay"
    return parse_settings(container["args"])


@needs_helm
def test_the_readmes_install_commands_render() -> None:
    """The top README's `helm install` renders as it is written (as `helm template`, with its
    flags), and its `kubectl apply` names files that exist."""
    readme = (ROOT / "README.md").read_text()
    (command,) = re.findall(r"^helm install .*$", readme.replace("\\\n", " "),
                            re.MULTILINE)
    words = shlex.split(command)
    assert words[:4] == ["helm", "install", "tg", "deploy/helm/tensorgate"], words
    flags = [w for w in words[4:] if w != "--create-namespace"]
    result = helm("template", *words[2:4], *flags, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    objects = [doc for doc in yaml.safe_load_all(result.stdout) if doc is not None]
    sets = dict(flags[i + 1].split("=", 1) for i, w in enumerate(flags) if w == "--set")
    container = _container(objects)
    assert container["image"].startswith(sets["image.repository"] + ":")
    volumes = one(objects, "Deployment")["spec"]["template"]["spec"]["volumes"]
    claims = [v["persistentVolumeClaim"]["claimName"] for v in volumes
              if "persistentVolumeClaim" in v]
    assert claims == [sets["modelRepository.pvc.claimName"]]
    (apply,) = re.findall(r"^kubectl apply .*$", readme, re.MULTILINE)
    files = [w for w in shlex.split(apply) if w.endswith(".yaml")]
    assert files and all((ROOT / f).is_file() for f in files), files


@needs_helm
@pytest.mark.parametrize("toggle", sorted(TOGGLES))
def test_lint_is_clean(toggle: str) -> None:
    assert lint_chart(TOGGLES[toggle]) == []


@needs_helm
def test_lint_reports_a_broken_chart(tmp_path: Path) -> None:
    """The lint check bites: a chart whose Chart.yaml lacks its version fails it."""
    broken = tmp_path / CHART.name
    shutil.copytree(CHART, broken)
    chart_yaml = broken / "Chart.yaml"
    chart_yaml.write_text(re.sub(r"(?m)^version:.*\n", "", chart_yaml.read_text()))
    findings = lint_chart(chart=broken)
    assert any("version is required" in f for f in findings), findings


@needs_helm
def test_every_object_is_valid(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    toggle, objects = rendered
    kinds = sorted(o["kind"] for o in objects)
    expected = {"Deployment", "Service"}
    if toggle in ("service-monitor", "everything"):
        expected.add("ServiceMonitor")
    if toggle in ("keda", "everything"):
        expected.add("ScaledObject")
    if toggle == "hpa":
        expected |= {"HorizontalPodAutoscaler", "ConfigMap"}
    assert set(kinds) == expected, kinds
    for obj in objects:
        assert obj["metadata"]["name"].startswith(FULLNAME)
        assert obj["metadata"]["labels"]["app.kubernetes.io/instance"] == RELEASE
        if obj["apiVersion"] in ("v1", "apps/v1", "autoscaling/v2"):
            validate_k8s(obj)
        else:
            assert obj["kind"] in ("ServiceMonitor", "ScaledObject"), obj["kind"]
            validate_crd(obj)


@needs_helm
def test_args_parse_with_tensorgates_command_line(
    rendered: tuple[str, list[dict[str, Any]]],
) -> None:
    toggle, objects = rendered
    settings = _settings(objects)
    values = _values()
    assert settings.model_repositories == (values["modelRepository"]["mountPath"],)
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8000, 8001, 8002)
    assert settings.allow_http and settings.allow_grpc and settings.allow_metrics
    assert settings.frontends == values["server"]["frontends"]
    assert settings.metrics_config == {"histogram_latencies": toggle != "no-histograms"}
    assert settings.strict_readiness and settings.exit_on_error
    mode = TOGGLES[toggle].get("server", {}).get("modelControlMode", "none")
    assert settings.model_control_mode == mode
    if toggle == "explicit":
        assert settings.load_models == ("simple", "mlp")
    if toggle == "poll":
        assert settings.repository_poll_secs == 30
        assert settings.log_verbose == 1 and settings.allow_client_shm
    deployment = one(objects, "Deployment")["spec"]["template"]["spec"]
    assert deployment["terminationGracePeriodSeconds"] > settings.exit_timeout_secs


@needs_helm
def test_deployment_shape(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    toggle, objects = rendered
    deployment = one(objects, "Deployment")
    pod = deployment["spec"]["template"]
    spec = pod["spec"]
    container = _container(objects)
    selector = deployment["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod["metadata"]["labels"].items()
    assert ("replicas" in deployment["spec"]) == (toggle not in ("keda", "hpa", "everything"))

    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "grpc": 8001, "metrics": 8002}
    probes = {kind: container[f"{kind}Probe"]["httpGet"] for kind in
              ("startup", "liveness", "readiness")}
    assert probes["startup"]["path"] == probes["liveness"]["path"] == "/v2/health/live"
    assert probes["readiness"]["path"] == "/v2/health/ready"
    assert all(probe["port"] in ports for probe in probes.values())
    startup = container["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300  # model loading

    assert container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["runAsUser"] == _image_user()
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert spec["automountServiceAccountToken"] is False

    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert volumes["shm"]["emptyDir"]["medium"] == "Memory"
    assert volumes["shm"]["emptyDir"]["sizeLimit"] == _values()["shm"]["sizeLimit"]
    assert mounts["/dev/shm"]["name"] == "shm"
    models = volumes[mounts["/models"]["name"]]
    source = TOGGLES[toggle].get("modelRepository", {}).get("source", "pvc")
    if source == "pvc":
        assert models["persistentVolumeClaim"]["claimName"] == "tensorgate-models"
        if toggle == "pvc-sub-path":
            assert mounts["/models"]["subPath"] == "repo"
            assert mounts["/models"]["readOnly"] is False
        else:
            assert mounts["/models"]["readOnly"] is True
    elif source == "hostPath":
        assert models["hostPath"]["path"] == "/srv/model_repository"
    else:
        assert models["emptyDir"]["sizeLimit"]
        (fetch,) = spec["initContainers"]
        assert {m["mountPath"] for m in fetch["volumeMounts"]} == {"/models"}
        assert fetch["command"][-1] == "/models"
        assert mounts["/models"]["readOnly"] is True  # the server only reads what it fetched
    if toggle == "everything":
        assert spec["runtimeClassName"] == "nvidia"
        assert deployment["spec"]["strategy"]["rollingUpdate"]["maxSurge"] == 0
        assert pod["metadata"]["labels"]["team"] == "ml"
        assert mounts["/tmp"]["name"] == "tmp"


@needs_helm
def test_services_reach_the_pods(rendered: tuple[str, list[dict[str, Any]]]) -> None:
    _, objects = rendered
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    port_names = {p["name"] for p in _container(objects)["ports"]}
    services = {s["metadata"]["name"]: s for s in by_kind(objects, "Service")}
    assert set(services) == {FULLNAME, f"{FULLNAME}-metrics"}
    for service in services.values():
        assert service["spec"]["selector"].items() <= pod_labels.items()
        assert {p["targetPort"] for p in service["spec"]["ports"]} <= port_names
    assert {p["name"]: p["port"] for p in services[FULLNAME]["spec"]["ports"]} == {
        "http": 8000, "grpc": 8001}
    assert [p["name"] for p in services[f"{FULLNAME}-metrics"]["spec"]["ports"]] == ["metrics"]


@needs_helm
def test_service_monitor_selects_the_metrics_service() -> None:
    objects = render_chart(TOGGLES["service-monitor"])
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["metadata"]["labels"]["release"] == "kps"
    selected = [
        s for s in by_kind(objects, "Service")
        if monitor["spec"]["selector"]["matchLabels"].items() <= s["metadata"]["labels"].items()
    ]
    assert [s["metadata"]["name"] for s in selected] == [f"{FULLNAME}-metrics"]
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [NAMESPACE]
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] in {p["name"] for p in selected[0]["spec"]["ports"]}
    assert endpoint["path"] == "/metrics"


def _queue_time_query_reads(query: str) -> None:
    parsed = parse_promql(query)
    assert parsed.metrics == {"nv_inference_queue_duration_us", "nv_inference_request_success"}
    window = _values()["autoscaling"]["window"]
    assert query.count(f"[{window}]") == 2


@needs_helm
def test_keda_scaled_object() -> None:
    objects = render_chart(TOGGLES["keda"])
    scaled = one(objects, "ScaledObject")
    values = _values()["autoscaling"]
    assert scaled["apiVersion"] == "keda.sh/v1alpha1"
    target = scaled["spec"]["scaleTargetRef"]
    deployment = one(objects, "Deployment")["metadata"]["name"]
    assert (target["kind"], target["name"]) == ("Deployment", deployment)
    assert scaled["spec"]["minReplicaCount"] == values["minReplicas"]
    assert scaled["spec"]["maxReplicaCount"] == values["maxReplicas"]
    assert values["minReplicas"] <= values["maxReplicas"]
    (trigger,) = scaled["spec"]["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metricType"] == "Value"
    metadata = trigger["metadata"]
    assert all(isinstance(v, str) for v in metadata.values()), "KEDA trigger metadata are strings"
    assert metadata["serverAddress"].startswith("http")
    assert float(metadata["threshold"]) == float(values["targetQueueTimeUs"])
    _queue_time_query_reads(metadata["query"])
    assert f'namespace="{NAMESPACE}"' in metadata["query"]
    assert f'service="{FULLNAME}-metrics"' in metadata["query"]
    behavior = scaled["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior == values["behavior"]


@needs_helm
def test_keda_series_selector_can_be_set() -> None:
    objects = render_chart({"autoscaling": {"keda": {"enabled": True},
                                            "seriesSelector": 'job="tg"'}})
    query = one(objects, "ScaledObject")["spec"]["triggers"][0]["metadata"]["query"]
    assert query.count('{job="tg"}') == 2 and "namespace=" not in query


@needs_helm
def test_hpa_and_its_adapter_rule() -> None:
    objects = render_chart(TOGGLES["hpa"])
    hpa = one(objects, "HorizontalPodAutoscaler")
    values = _values()["autoscaling"]
    assert hpa["spec"]["scaleTargetRef"]["name"] == one(objects, "Deployment")["metadata"]["name"]
    (metric,) = hpa["spec"]["metrics"]
    assert metric["type"] == "Pods"
    assert metric["pods"]["metric"]["name"] == values["hpa"]["metricName"]
    assert metric["pods"]["target"] == {"type": "AverageValue",
                                        "averageValue": values["targetQueueTimeUs"]}
    config = yaml.safe_load(one(objects, "ConfigMap")["data"]["config.yaml"])
    (rule,) = config["rules"]
    assert rule["name"]["as"] == values["hpa"]["metricName"]
    assert re.fullmatch(rule["name"]["matches"], "nv_inference_queue_duration_us")
    assert rule["resources"]["overrides"] == {"namespace": {"resource": "namespace"},
                                              "pod": {"resource": "pod"}}
    assert parse_promql(rule["seriesQuery"]).metrics == {"nv_inference_queue_duration_us"}
    _queue_time_query_reads(rule["metricsQuery"])
    assert "<<.LabelMatchers>>" in rule["metricsQuery"] and "<<.GroupBy>>" in rule["metricsQuery"]
    # The README's snippet is this rule.
    readme = (CHART / "README.md").read_text()
    snippet = re.search(r"```yaml\n(rules:\n  custom:.*?)```", readme, re.DOTALL)
    assert snippet is not None
    assert yaml.safe_load(snippet.group(1))["rules"]["custom"] == [rule]
    without = render_chart({"autoscaling": {"hpa": {"enabled": True,
                                                    "adapterRulesConfigMap": False}}})
    assert by_kind(without, "ConfigMap") == []


@needs_helm
@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"autoscaling": {"keda": {"enabled": True}, "hpa": {"enabled": True}}},
         "at most one of autoscaling.keda and autoscaling.hpa"),
        ({"modelRepository": {"source": "nfs"}}, "must be pvc, hostPath or initContainer"),
        ({"modelRepository": {"pvc": {"claimName": ""}}}, "claimName is required"),
        ({"server": {"modelControlMode": "sometimes"}}, "must be none, poll or explicit"),
        ({"server": {"loadModels": ["simple"]}}, "loadModels needs"),
    ],
)
def test_bad_values_are_refused(values: dict[str, Any], message: str) -> None:
    with pytest.raises(RenderError, match=re.escape(message)):
        render_chart(values)


@needs_helm
def test_notes() -> None:
    notes = render_notes()
    assert f"deployment/{FULLNAME}" in notes and "/v2/health/ready" in notes
    assert "600 s" in notes  # the startup probe's budget, 10 s x 60
    keda = render_notes(TOGGLES["keda"])
    assert "KEDA scales 1-4 replicas" in keda and "nv_inference_queue_duration_us" in keda
    hpa = render_notes(TOGGLES["hpa"])
    assert f"{FULLNAME}-prometheus-adapter-rules" in hpa
    assert "custom.metrics.k8s.io" in hpa
