"""Custom resources validated against their projects' CRD schemas (``schemas/``).

A CRD's ``openAPIV3Schema`` is OpenAPI with Kubernetes extensions, not plain JSON Schema. It is
turned into JSON Schema 2020-12 with the meaning the API server gives it, and only then handed
to ``jsonschema``:

* Unknown fields are errors where the schema lists ``properties`` and neither
  ``additionalProperties`` nor ``x-kubernetes-preserve-unknown-fields: true``: that is what
  ``kubectl apply`` does by default since Kubernetes 1.27 (``--validate=strict``, server-side
  field validation), where the server would otherwise prune them silently.
* ``x-kubernetes-int-or-string: true``: an integer or a string. ``nullable: true``: null too.
* ``x-kubernetes-list-type: set``: unique items; ``map``: items unique by their
  ``x-kubernetes-list-map-keys``. ``x-kubernetes-embedded-resource``: apiVersion, kind and
  metadata are allowed and the first two required.
* Formats ``int32``, ``int64`` (ranges) and ``date-time`` are checked.
* CEL rules (``x-kubernetes-validations``) cannot be run here: each one the schemas hold has a
  Python equivalent in ``CEL_RULES``, and a schema with a rule missing from it is refused.
* ``x-kubernetes-map-type`` only affects server-side apply merges and is dropped.

An extension or format not listed here makes the conversion fail, so that a new fixture cannot
be validated with part of its meaning ignored.
"""

from __future__ import annotations

import datetime
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import jsonschema
from jsonschema import Draft202012Validator, FormatChecker, ValidationError

Schema = dict[str, Any]
SCHEMAS = Path(__file__).parent / "schemas"
# (apiVersion, kind) -> fixture
CRD_SCHEMAS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
    ("keda.sh/v1alpha1", "ScaledObject"): "scaledobject.json",
    ("serving.kserve.io/v1alpha1", "ServingRuntime"): "servingruntime.json",
    ("serving.kserve.io/v1beta1", "InferenceService"): "inferenceservice.json",
}
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf")
_SCHEMA_ONE = ("additionalProperties", "items", "not")
_FORMATS = frozenset({"int32", "int64", "date-time"})
_EXTENSIONS = frozenset({
    "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
    "x-kubernetes-list-type", "x-kubernetes-list-map-keys", "x-kubernetes-map-type",
    "x-kubernetes-embedded-resource", "x-kubernetes-validations",
})
_INT_OR_STRING = [{"type": "integer"}, {"type": "string"}]


def _scaled_object_replicas(spec: Any) -> bool:
    if not isinstance(spec, dict) or "minReplicaCount" not in spec:
        return True
    low, high = spec["minReplicaCount"], spec.get("maxReplicaCount", 100)
    return not (isinstance(low, int) and isinstance(high, int)) or low <= high


# CEL rule (as the CRD writes it) -> the same test in Python.
CEL_RULES: dict[str, Callable[[Any], bool]] = {
    # KEDA ScaledObject .spec (100: KEDA's default maxReplicaCount)
    "!has(self.minReplicaCount) || self.minReplicaCount <= (has(self.maxReplicaCount) ? "
    "self.maxReplicaCount : 100)": _scaled_object_replicas,
}


def kubernetes_semantics(schema: Schema) -> Schema:
    """``schema`` (a CRD ``openAPIV3Schema``, or one of its subschemas) as JSON Schema with
    the API server's meaning; see the module's docstring."""
    out: Schema = {}
    for key, value in schema.items():
        if key in _SCHEMA_MAPS:
            out[key] = {name: kubernetes_semantics(sub) for name, sub in value.items()}
        elif key in _SCHEMA_LISTS:
            out[key] = [kubernetes_semantics(sub) for sub in value]
        elif key in _SCHEMA_ONE and isinstance(value, dict):
            out[key] = kubernetes_semantics(value)
        elif key.startswith("x-kubernetes-"):
            assert key in _EXTENSIONS, f"{key} is not handled: say here what it means"
        else:
            out[key] = value
    assert out.get("format", "int32") in _FORMATS, f"format {out['format']} is not checked"

    if schema.get("x-kubernetes-embedded-resource"):
        properties = out.setdefault("properties", {})
        properties.setdefault("apiVersion", {"type": "string"})
        properties.setdefault("kind", {"type": "string"})
        properties.setdefault("metadata", {"type": "object"})
        out["required"] = sorted({*out.get("required", []), "apiVersion", "kind"})
    if ("properties" in out and "additionalProperties" not in out
            and not schema.get("x-kubernetes-preserve-unknown-fields")):
        out["additionalProperties"] = False
    list_type = schema.get("x-kubernetes-list-type")
    assert list_type in (None, "atomic", "set", "map"), list_type
    if list_type == "set":
        out["uniqueItems"] = True
    if list_type == "map":
        out["x-list-map-keys"] = schema["x-kubernetes-list-map-keys"]
    if "x-kubernetes-validations" in schema:
        rules = [rule["rule"] for rule in schema["x-kubernetes-validations"]]
        for rule in rules:
            assert rule in CEL_RULES, f"CEL rule without a Python equivalent: {rule}"
        out["x-cel-rules"] = rules
    if schema.get("x-kubernetes-int-or-string"):
        assert "type" not in out, out
        if out.get("anyOf") != _INT_OR_STRING:  # controller-gen writes both; Kubernetes, one
            out = {"allOf": [out, {"anyOf": _INT_OR_STRING}]}
    if out.pop("nullable", False):
        out = {"anyOf": [out, {"type": "null"}]}
    return out


def _list_map_keys(validator: Any, keys: list[str], instance: Any,
                   schema: Schema) -> Iterator[ValidationError]:
    if not validator.is_type(instance, "array"):
        return
    seen: set[str] = set()
    for item in instance:
        if not isinstance(item, dict):
            continue
        key = json.dumps([item.get(k) for k in keys])
        if key in seen:
            yield ValidationError(f"two items with the same {keys}: {key}")
        seen.add(key)


def _cel_rules(validator: Any, rules: list[str], instance: Any,
               schema: Schema) -> Iterator[ValidationError]:
    for rule in rules:
        if not CEL_RULES[rule](instance):
            yield ValidationError(f"fails the CEL rule {rule}")


_Validator = jsonschema.validators.extend(
    Draft202012Validator, {"x-list-map-keys": _list_map_keys, "x-cel-rules": _cel_rules})
_FORMAT_CHECKER = FormatChecker(formats=())


@_FORMAT_CHECKER.checks("int32")  # type: ignore[untyped-decorator]
def _int32(value: object) -> bool:
    return not isinstance(value, int) or -(2**31) <= value < 2**31


@_FORMAT_CHECKER.checks("int64")  # type: ignore[untyped-decorator]
def _int64(value: object) -> bool:
    return not isinstance(value, int) or -(2**63) <= value < 2**63


@_FORMAT_CHECKER.checks("date-time", raises=ValueError)  # type: ignore[untyped-decorator]
def _date_time(value: object) -> bool:
    if isinstance(value, str):
        datetime.datetime.fromisoformat(value)
    return True


def load_schema(name: str) -> Schema:
    schema: Schema = json.loads((SCHEMAS / name).read_text())
    return schema


@functools.cache
def crd_validator(api_version: str, kind: str) -> Any:
    schema = kubernetes_semantics(load_schema(CRD_SCHEMAS[(api_version, kind)]))
    Draft202012Validator.check_schema(schema)
    return _Validator(schema, format_checker=_FORMAT_CHECKER)


def crd_errors(resource: dict[str, Any]) -> list[str]:
    """Where ``resource`` breaks its CRD's schema, one line each (empty: valid)."""
    validator = crd_validator(resource["apiVersion"], resource["kind"])
    return sorted(
        f"{'.'.join(str(p) for p in error.absolute_path) or '(root)'}: {error.message}"
        for error in validator.iter_errors(resource)
    )


def validate_crd(resource: dict[str, Any]) -> None:
    """Assert that a custom resource is valid for its CRD (tensorgate's fixtures)."""
    errors = crd_errors(resource)
    assert not errors, (
        f"{resource['kind']} {resource['metadata']['name']} breaks its CRD's schema:\n  "
        + "\n  ".join(errors)
    )
