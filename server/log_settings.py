"""The logging extension's requests, checked as Triton checks them (``GET/POST /v2/logging``
and the ``LogSettings`` RPC), and its answers; ``server.logs.update`` applies the changes.

Triton looks only at the settings it knows, in the order below, and ignores any other name;
a setting given as null (HTTP) is left as it is. The log file cannot be changed over the
network. Unlike Triton, a request with one bad setting changes none (Triton keeps the ones it
applied before the bad one), and a wrong value over HTTP is a 400 (Triton: 500, or 503 for an
unknown format), since it is the client's mistake.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from server.errors import InvalidArgument, Unsupported
from server.generated import grpc_service_pb2 as pb

FILE_REFUSED = "log file location can not be updated through network protocol"
FORMATS = ("default", "ISO8601")
_SEVERITIES = ("log_info", "log_warning", "log_error")
_UINT32_MAX = (1 << 32) - 1
#: Triton's JSON parser's texts for a value of the wrong type.
_NOT_BOOL = "attempt to access JSON non-boolean as boolean"
_NOT_UINT = "attempt to access JSON non-unsigned-integer as unsigned-integer"
_NOT_STRING = "attempt to access JSON non-string as string"


def from_json(body: Mapping[str, Any]) -> dict[str, Any]:
    """The changes a ``POST /v2/logging`` body asks for, checked."""
    if body.get("log_file") is not None:
        raise Unsupported(FILE_REFUSED)
    changes: dict[str, Any] = {}
    for key in _SEVERITIES:
        value = body.get(key)
        if value is not None:
            if type(value) is not bool:
                raise InvalidArgument(_NOT_BOOL)
            changes[key] = value
    level = body.get("log_verbose_level")
    if level is not None:
        if type(level) is not int or not 0 <= level <= _UINT32_MAX:
            raise InvalidArgument(_NOT_UINT)
        changes["log_verbose_level"] = level
    style = body.get("log_format")
    if style is not None:
        if type(style) is not str:
            raise InvalidArgument(_NOT_STRING)
        if style not in FORMATS:
            raise InvalidArgument(f"invalid argument for --log_format, got: {style}")
        changes["log_format"] = style
    return changes


def from_grpc(settings: Mapping[str, pb.LogSettingsRequest.SettingValue]) -> dict[str, Any]:
    """The changes a ``LogSettingsRequest`` asks for, checked (its texts are gRPC's own)."""
    if "log_file" in settings:
        raise Unsupported(FILE_REFUSED)
    changes: dict[str, Any] = {}
    for key in _SEVERITIES:
        if key in settings:
            changes[key] = _choice(settings[key], key, "bool_param", "boolean")
    if "log_verbose_level" in settings:
        changes["log_verbose_level"] = _choice(
            settings["log_verbose_level"], "log_verbose_level", "uint32_param", "int32"
        )
    if "log_format" in settings:
        style = _choice(settings["log_format"], "log_format", "string_param", "string")
        if style not in FORMATS:
            raise InvalidArgument(f"invalid argument for log_format, got: {style}")
        changes["log_format"] = style
    return changes


def _choice(value: pb.LogSettingsRequest.SettingValue, key: str, field: str, kind: str) -> Any:
    if value.WhichOneof("parameter_choice") != field:
        raise InvalidArgument(f"expect {kind} for '{key}'")
    return getattr(value, field)


def to_grpc(current: Mapping[str, Any]) -> pb.LogSettingsResponse:
    """Every setting as the RPC answers it: each value in the field of its type."""
    response = pb.LogSettingsResponse()
    for key, value in current.items():
        setting = response.settings[key]
        if isinstance(value, bool):
            setting.bool_param = value
        elif isinstance(value, int):
            setting.uint32_param = value
        else:
            setting.string_param = str(value)
    return response
