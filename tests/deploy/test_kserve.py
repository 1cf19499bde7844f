"""deploy/kserve: the ServingRuntime and the InferenceServices that use it.

KServe's resources are custom ones: each file is validated against the schema of KServe's own
CRD (``schemas/``, through ``crds``: unknown fields and wrong types are errors), and what they
embed from Kubernetes (containers, volumes) also against the Kubernetes schemas as a Pod. The
runtime's arguments are parsed by tensorgate's command line and, in test_live_server.py, start
a real server.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from server.cli import parse_settings
from server.settings import Settings
from tests.deploy.crds import validate_crd
from tests.deploy.manifests import (
    KSERVE,
    as_pod,
    load_yaml_documents,
    unquoted_quantities,
    validate_k8s,
)
from tests.server_process import ROOT

RUNTIME_FILE = KSERVE / "servingruntime.yaml"
SERVICE_FILES = sorted(KSERVE.glob("inferenceservice*.yaml"))
PROTOCOLS = frozenset({"v1", "v2", "grpc-v1", "grpc-v2"})
# The model spec's own fields (v1beta1 ModelSpec); the rest are a container's.
MODEL_SPEC_FIELDS = frozenset({"modelFormat", "runtime", "storageUri", "protocolVersion",
                               "runtimeVersion"})
# KServe's serving port for HTTP (InferenceServiceDefaultHttpPort) and its Triton gRPC port.
KSERVE_HTTP_PORT = 8080
KSERVE_GRPC_PORT = 9000


def _runtime() -> dict[str, Any]:
    (runtime,) = load_yaml_documents(RUNTIME_FILE)
    return runtime


def _container() -> dict[str, Any]:
    (container,) = _runtime()["spec"]["containers"]
    assert isinstance(container, dict)
    return container


def runtime_settings() -> Settings:
    return parse_settings(_container()["args"])


def test_serving_runtime_fields() -> None:
    runtime = _runtime()
    assert runtime["apiVersion"] == "serving.kserve.io/v1alpha1"
    assert runtime["kind"] == "ServingRuntime"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", runtime["metadata"]["name"])
    spec = runtime["spec"]
    assert set(spec["protocolVersions"]) == {"v2", "grpc-v2"} <= PROTOCOLS
    formats = {f["name"]: f for f in spec["supportedModelFormats"]}
    assert set(formats) == {"onnx", "triton"}
    for model_format in formats.values():
        assert isinstance(model_format["version"], str)
        assert isinstance(model_format.get("autoSelect", False), bool)
        priority = model_format.get("priority", 1)
        assert isinstance(priority, int) and priority >= 1
    # ONNX is what tensorgate serves; a Triton repository may hold TensorRT or TensorFlow models
    # it cannot load, so that format is not picked automatically.
    assert formats["onnx"]["autoSelect"] is True
    assert formats["triton"]["autoSelect"] is False


@pytest.mark.parametrize("path", [RUNTIME_FILE, *SERVICE_FILES], ids=lambda p: p.name)
def test_valid_for_kserves_crd(path: Any) -> None:
    (resource,) = load_yaml_documents(path)
    validate_crd(resource)


def test_serving_runtime_pod_is_valid_kubernetes() -> None:
    spec = _runtime()["spec"]
    validate_k8s(as_pod("tensorgate-runtime", {"containers": spec["containers"],
                                               "volumes": spec["volumes"]}))
    assert _container()["name"] == "kserve-container"  # the name KServe merges the model into


def test_runtime_args_are_a_tensorgate_launch_line() -> None:
    container = _container()
    assert "command" not in container, "the image's entrypoint (tensorgate) must stay"
    settings = runtime_settings()
    assert settings.model_repositories == ("/mnt/models",)  # where KServe puts the model
    assert (settings.http_port, settings.grpc_port) == (KSERVE_HTTP_PORT, KSERVE_GRPC_PORT)
    assert settings.allow_http and settings.allow_grpc and settings.allow_metrics
    assert settings.metrics_config == {"histogram_latencies": True}
    assert settings.frontends is not None  # without a CPU limit, one per node core is too many


def test_prometheus_annotations_name_the_metrics_endpoint() -> None:
    annotations = _runtime()["spec"]["annotations"]
    assert annotations["prometheus.kserve.io/port"] == str(runtime_settings().metrics_port)
    assert annotations["prometheus.kserve.io/path"] == "/metrics"


def test_runtime_is_non_root_as_the_image() -> None:
    users = re.findall(r"^USER\s+(\S+)\s*$", (ROOT / "Dockerfile.cuda").read_text(), re.MULTILINE)
    context = _container()["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == int(users[-1])
    assert context["allowPrivilegeEscalation"] is False


def test_runtime_has_a_memory_dev_shm() -> None:
    spec = _runtime()["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    (mount,) = [m for m in _container()["volumeMounts"] if m["mountPath"] == "/dev/shm"]
    assert volumes[mount["name"]]["emptyDir"]["medium"] == "Memory"


@pytest.mark.parametrize("path", [RUNTIME_FILE, *SERVICE_FILES], ids=lambda p: p.name)
def test_quantities_are_quoted(path: Any) -> None:
    assert unquoted_quantities(path.read_text()) == []


@pytest.mark.parametrize("path", SERVICE_FILES, ids=lambda p: p.name)
def test_inference_service_uses_the_runtime(path: Any) -> None:
    (service,) = load_yaml_documents(path)
    runtime = _runtime()
    assert service["apiVersion"] == "serving.kserve.io/v1beta1"
    assert service["kind"] == "InferenceService"
    annotations = service["metadata"]["annotations"]
    assert annotations["serving.kserve.io/enable-prometheus-scraping"] == "true"
    predictor = service["spec"]["predictor"]
    assert set(predictor) <= {"model", "minReplicas", "maxReplicas"}
    assert predictor["minReplicas"] <= predictor["maxReplicas"]
    model = predictor["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    formats = {(f["name"], f["version"]) for f in runtime["spec"]["supportedModelFormats"]}
    assert (model["modelFormat"]["name"], model["modelFormat"]["version"]) in formats
    assert model["protocolVersion"] in runtime["spec"]["protocolVersions"]
    assert re.match(r"(pvc|s3|gs|https?)://", model["storageUri"])
    assert model["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # What is not KServe's own is a container: validate it as one.
    container = {k: v for k, v in model.items() if k not in MODEL_SPEC_FIELDS}
    validate_k8s(as_pod(service["metadata"]["name"],
                        {"containers": [{"name": "kserve-container", **container}]}))

    settings = runtime_settings()
    if model["protocolVersion"] == "grpc-v2":
        # The serving port is the one declared, the runtime's gRPC port, h2c for Knative.
        (port,) = model["ports"]
        assert (port["name"], port["containerPort"]) == ("h2c", settings.grpc_port)
    else:
        assert "ports" not in model  # KServe's default serving port, 8080
        assert settings.http_port == KSERVE_HTTP_PORT
        probe = model["readinessProbe"]["httpGet"]
        assert (probe["path"], probe["port"]) == ("/v2/health/ready", settings.http_port)


def test_both_protocols_have_an_example() -> None:
    protocols = {load_yaml_documents(p)[0]["spec"]["predictor"]["model"]["protocolVersion"]
                 for p in SERVICE_FILES}
    assert protocols == {"v2", "grpc-v2"}
