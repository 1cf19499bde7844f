"""The CRD schemas of schemas/ and their validation (``crds``): the fixtures are documented and
whole, the Kubernetes extensions mean what the API server makes of them, and manifests broken
on purpose (a misspelled field, a wrong type, a broken rule) are rejected, so that the
validation of the chart's and deploy/kserve's custom resources is known to bite.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from typing import Any

import pytest
from jsonschema import Draft202012Validator

from tests.deploy.crds import (
    _FORMAT_CHECKER,
    CRD_SCHEMAS,
    SCHEMAS,
    _Validator,
    crd_errors,
    kubernetes_semantics,
    load_schema,
    validate_crd,
)
from tests.deploy.manifests import KSERVE, load_yaml_documents, needs_helm, one, render_chart

README = SCHEMAS / "README.md"


def _subschemas(schema: Any) -> Iterator[dict[str, Any]]:
    if not isinstance(schema, dict):
        return
    yield schema
    for key in ("properties", "patternProperties", "$defs"):
        for sub in schema.get(key, {}).values():
            yield from _subschemas(sub)
    for key in ("allOf", "anyOf", "oneOf"):
        for sub in schema.get(key, []):
            yield from _subschemas(sub)
    for key in ("additionalProperties", "items", "not"):
        yield from _subschemas(schema.get(key))


# The fixtures ----------------------------------------------------------------------------------


def test_every_fixture_is_used_and_documented() -> None:
    files = sorted(p.name for p in SCHEMAS.glob("*.json"))
    assert files == sorted(CRD_SCHEMAS.values())
    readme = README.read_text()
    assert "Apache-2.0" in readme and "description" in readme and "$defs" in readme
    for (api_version, kind), name in CRD_SCHEMAS.items():
        row = next((line for line in readme.splitlines() if f"`{name}`" in line), None)
        assert row is not None, f"{name} is not in schemas/README.md"
        assert kind in row and api_version in row
        assert re.search(r"\b[0-9a-f]{40}\b", row), f"{name}: the source commit"
        assert "Apache-2.0" in row
        comment = load_schema(name)["$comment"]
        assert comment.startswith(f"{kind} {api_version}:"), comment
        assert re.search(r"\b[0-9a-f]{40}\b", comment) and "Apache-2.0" in comment


@pytest.mark.parametrize("name", sorted(CRD_SCHEMAS.values()))
def test_fixture_is_a_whole_crd_schema(name: str) -> None:
    schema = load_schema(name)
    assert schema["type"] == "object"
    assert {"apiVersion", "kind", "metadata", "spec"} <= set(schema["properties"])
    defs = schema.get("$defs", {})
    refs = [s["$ref"] for s in _subschemas(schema) if "$ref" in s]
    assert {ref.removeprefix("#/$defs/") for ref in refs} == set(defs), "a dangling or unused $def"
    assert not any("description" in s for s in _subschemas(schema))
    Draft202012Validator.check_schema(kubernetes_semantics(schema))


# What the extensions mean ----------------------------------------------------------------------


def _accepts(schema: dict[str, Any], instance: Any) -> bool:
    validator = _Validator(kubernetes_semantics(schema), format_checker=_FORMAT_CHECKER)
    return bool(validator.is_valid(instance))


def test_int_or_string_is_an_integer_or_a_string() -> None:
    for schema in ({"x-kubernetes-int-or-string": True},
                   {"anyOf": [{"type": "integer"}, {"type": "string"}],
                    "x-kubernetes-int-or-string": True}):
        assert _accepts(schema, 8002) and _accepts(schema, "metrics")
        wrong: object
        for wrong in (True, 1.5, None, [], {}):
            assert not _accepts(schema, wrong), (schema, wrong)


def test_unknown_fields_are_refused_unless_preserved() -> None:
    closed = {"type": "object", "properties": {"a": {"type": "string"}}}
    assert _accepts(closed, {"a": "x"})
    assert not _accepts(closed, {"a": "x", "b": "y"})
    assert _accepts({**closed, "x-kubernetes-preserve-unknown-fields": True}, {"b": "y"})
    assert _accepts({"type": "object", "additionalProperties": {"type": "string"}}, {"b": "y"})
    assert not _accepts({"type": "object", "additionalProperties": {"type": "string"}},
                        {"b": 1})
    nested = {"type": "object", "properties": {"spec": closed}}
    assert not _accepts(nested, {"spec": {"b": "y"}})


def test_nullable_lists_and_formats() -> None:
    assert _accepts({"type": "string", "nullable": True}, None)
    assert not _accepts({"type": "string"}, None)
    assert not _accepts({"type": "array", "items": {"type": "string"},
                         "x-kubernetes-list-type": "set"}, ["a", "a"])
    keyed = {"type": "array", "x-kubernetes-list-type": "map",
             "x-kubernetes-list-map-keys": ["containerPort", "protocol"],
             "items": {"type": "object", "properties": {"containerPort": {"type": "integer"},
                                                        "protocol": {"type": "string"}}}}
    assert _accepts(keyed, [{"containerPort": 1, "protocol": "TCP"},
                            {"containerPort": 1, "protocol": "UDP"}])
    assert not _accepts(keyed, [{"containerPort": 1, "protocol": "TCP"},
                                {"containerPort": 1, "protocol": "TCP"}])
    assert _accepts({"type": "integer", "format": "int32"}, 2**31 - 1)
    assert not _accepts({"type": "integer", "format": "int32"}, 2**31)
    assert not _accepts({"type": "integer", "format": "int64"}, 2**63)
    assert _accepts({"type": "string", "format": "date-time"}, "2026-01-02T03:04:05Z")
    assert not _accepts({"type": "string", "format": "date-time"}, "yesterday")


@pytest.mark.parametrize("schema", [
    {"type": "object", "x-kubernetes-something-new": True},
    {"type": "string", "format": "cidr"},
    {"type": "object", "x-kubernetes-validations": [{"rule": "self.a == 1"}]},
], ids=["extension", "format", "cel-rule"])
def test_what_is_not_understood_is_refused(schema: dict[str, Any]) -> None:
    with pytest.raises(AssertionError):
        kubernetes_semantics(schema)


# Broken manifests are rejected ----------------------------------------------------------------


def _kserve(name: str) -> dict[str, Any]:
    (resource,) = load_yaml_documents(KSERVE / name)
    return resource


def _rejected(resource: dict[str, Any], where: str, what: str) -> None:
    errors = crd_errors(resource)
    assert any(e.startswith(f"{where}:") and what in e for e in errors), errors


def test_a_broken_serving_runtime_is_rejected() -> None:
    runtime = _kserve("servingruntime.yaml")
    assert crd_errors(runtime) == []

    broken = copy.deepcopy(runtime)
    broken["spec"]["supportedModelFormat"] = broken["spec"].pop("supportedModelFormats")
    _rejected(broken, "spec", "'supportedModelFormat' was unexpected")

    broken = copy.deepcopy(runtime)
    broken["spec"]["supportedModelFormats"][0]["priority"] = "2"
    _rejected(broken, "spec.supportedModelFormats.0.priority", "is not of type 'integer'")

    broken = copy.deepcopy(runtime)
    broken["spec"]["supportedModelFormats"][0]["priority"] = 0
    _rejected(broken, "spec.supportedModelFormats.0.priority", "less than the minimum of 1")

    broken = copy.deepcopy(runtime)
    container = broken["spec"]["containers"][0]
    container["securityContext"]["runAsUser"] = "10001"
    container["volumeMount"] = container.pop("volumeMounts")
    _rejected(broken, "spec.containers.0.securityContext.runAsUser", "not of type 'integer'")
    _rejected(broken, "spec.containers.0", "'volumeMount' was unexpected")

    broken = copy.deepcopy(runtime)  # ports: a list map keyed by containerPort and protocol
    broken["spec"]["containers"][0]["ports"] = [{"containerPort": 8080, "protocol": "TCP"}] * 2
    _rejected(broken, "spec.containers.0.ports", "two items with the same")


@pytest.mark.parametrize("name", ["inferenceservice.yaml", "inferenceservice-grpc.yaml"])
def test_a_broken_inference_service_is_rejected(name: str) -> None:
    service = _kserve(name)
    assert crd_errors(service) == []

    broken = copy.deepcopy(service)
    model = broken["spec"]["predictor"]["model"]
    model["storageURI"] = model.pop("storageUri")
    _rejected(broken, "spec.predictor.model", "'storageURI' was unexpected")

    broken = copy.deepcopy(service)
    broken["spec"]["predictor"]["minReplicas"] = "1"
    _rejected(broken, "spec.predictor.minReplicas", "is not of type 'integer'")

    broken = copy.deepcopy(service)
    broken["spec"]["predicter"] = broken["spec"].pop("predictor")
    _rejected(broken, "spec", "'predictor' is a required property")
    _rejected(broken, "spec", "'predicter' was unexpected")

    broken = copy.deepcopy(service)
    resources = broken["spec"]["predictor"]["model"]["resources"]
    resources["limits"]["nvidia.com/gpu"] = True  # a quantity is an integer or a string
    _rejected(broken, "spec.predictor.model.resources.limits.nvidia.com/gpu",
              "is not valid under any of the given schemas")


@needs_helm
def test_a_broken_service_monitor_is_rejected() -> None:
    monitor = one(render_chart({"metrics": {"serviceMonitor": {"enabled": True}}}),
                  "ServiceMonitor")
    assert crd_errors(monitor) == []

    broken = copy.deepcopy(monitor)
    broken["spec"]["endpoints"][0]["intervall"] = "30s"
    _rejected(broken, "spec.endpoints.0", "'intervall' was unexpected")

    broken = copy.deepcopy(monitor)
    broken["spec"]["endpoints"][0]["interval"] = "half a minute"
    _rejected(broken, "spec.endpoints.0.interval", "does not match")

    for port in (8002, "metrics"):  # int-or-string
        fine = copy.deepcopy(monitor)
        fine["spec"]["endpoints"][0]["targetPort"] = port
        assert crd_errors(fine) == []
    broken = copy.deepcopy(monitor)
    broken["spec"]["endpoints"][0]["targetPort"] = True
    _rejected(broken, "spec.endpoints.0.targetPort", "is not valid under any of the given schemas")

    broken = copy.deepcopy(monitor)
    broken["spec"]["endpoints"][0]["port"] = 8002
    _rejected(broken, "spec.endpoints.0.port", "is not of type 'string'")


@needs_helm
def test_a_broken_scaled_object_is_rejected() -> None:
    scaled = one(render_chart({"autoscaling": {"keda": {"enabled": True}}}), "ScaledObject")
    assert crd_errors(scaled) == []

    broken = copy.deepcopy(scaled)
    broken["spec"]["triggers"][0]["metadata"]["threshold"] = 200000  # KEDA wants strings
    _rejected(broken, "spec.triggers.0.metadata.threshold", "is not of type 'string'")

    broken = copy.deepcopy(scaled)
    broken["spec"]["maxReplicaCount"] = "4"
    _rejected(broken, "spec.maxReplicaCount", "is not of type 'integer'")

    broken = copy.deepcopy(scaled)
    broken["spec"]["pollingInterval"] = 2**31
    _rejected(broken, "spec.pollingInterval", "is not a 'int32'")

    broken = copy.deepcopy(scaled)
    broken["spec"]["minReplicaCount"] = broken["spec"]["maxReplicaCount"] + 1
    _rejected(broken, "spec", "fails the CEL rule")

    broken = copy.deepcopy(scaled)
    broken["spec"]["scaleTargetRef"]["nam"] = broken["spec"]["scaleTargetRef"].pop("name")
    _rejected(broken, "spec.scaleTargetRef", "'name' is a required property")
    _rejected(broken, "spec.scaleTargetRef", "'nam' was unexpected")


def test_errors_name_the_resource() -> None:
    broken = _kserve("servingruntime.yaml")
    broken["spec"]["replica"] = 1
    with pytest.raises(AssertionError, match=r"ServingRuntime tensorgate breaks its CRD's "
                       r"schema:\n  spec: .*'replica' was unexpected"):
        validate_crd(broken)
