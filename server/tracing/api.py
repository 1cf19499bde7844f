"""The trace extension's requests, checked as Triton 2.51 checks them
(``HandleTrace`` in ``src/http_server.cc``, the ``TraceSetting`` RPC in
``src/grpc/grpc_server.cc``), and its answers.

Values are strings (``trace_level`` a list of them), parsed as C++'s ``std::stoi`` does:
leading digits count, the rest is ignored. A null (HTTP) or empty (gRPC) value clears the
setting. The trace file cannot be changed over the network. Where Triton silently ignores a
level it does not know, or wraps a negative rate around, this refuses it: a client's
mistake is a 400 / INVALID_ARGUMENT.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from server.errors import InvalidArgument, Unsupported
from server.generated import grpc_service_pb2 as pb
from server.tracing.config import LEVELS
from server.tracing.manager import CLEAR

FILE_REFUSED = "trace file location can not be updated through network protocol"
ONLY_OFF = "Expect only one trace level 'OFF' is specified"
_LEADING_INTEGER = re.compile(r"\s*([+-]?\d+)")
_INT32 = (-(1 << 31), (1 << 31) - 1)
_UINT32_MAX = (1 << 32) - 1
_NOT_STRING = "attempt to access JSON non-string as string"
_NOT_ARRAY = "attempt to access JSON non-array as array"
#: Setting -> (least value, largest value shown in the out-of-range text).
_RANGES = {
    "trace_rate": (0, _UINT32_MAX),
    "trace_count": (-1, _INT32[1]),
    "log_frequency": (0, _UINT32_MAX),
}


def from_json(body: Mapping[str, Any]) -> dict[str, Any]:
    """The changes a ``POST /v2[/models/<m>]/trace/setting`` body asks for, checked."""
    if "trace_file" in body:
        raise Unsupported(FILE_REFUSED)
    changes: dict[str, Any] = {}
    if "trace_level" in body:
        levels = body["trace_level"]
        if levels is None:
            changes["trace_level"] = CLEAR
        else:
            if not isinstance(levels, list):
                raise InvalidArgument(_NOT_ARRAY)
            if not all(isinstance(level, str) for level in levels):
                raise InvalidArgument(_NOT_STRING)
            if levels:  # (an empty list changes nothing, as in Triton)
                changes["trace_level"] = _levels(levels)
    for key in _RANGES:
        if key in body:
            value = body[key]
            if value is None:
                changes[key] = CLEAR
            elif not isinstance(value, str):
                raise InvalidArgument(_NOT_STRING)
            else:
                changes[key] = _number(key, value, http=True)
    return changes


def from_grpc(settings: Mapping[str, pb.TraceSettingRequest.SettingValue]) -> dict[str, Any]:
    """The changes a ``TraceSettingRequest`` asks for, checked (its texts are gRPC's own)."""
    if "trace_file" in settings:
        raise Unsupported(FILE_REFUSED)
    changes: dict[str, Any] = {}
    if "trace_level" in settings:
        levels = list(settings["trace_level"].value)
        changes["trace_level"] = _levels(levels) if levels else CLEAR
    for key in _RANGES:
        if key in settings:
            values = settings[key].value
            if not values:
                changes[key] = CLEAR
            elif len(values) > 1:
                raise InvalidArgument(f"expect only 1 value for '{key}'")
            else:
                changes[key] = _number(key, values[0], http=False)
    return changes


def _levels(levels: Sequence[str]) -> list[str]:
    """The levels asked for, in Triton's order (a list: it crosses the process boundary)."""
    chosen = set()
    for level in levels:
        if level == "OFF":
            if len(levels) != 1:
                raise InvalidArgument(ONLY_OFF)
        elif level in ("TIMESTAMPS", "TENSORS"):
            chosen.add(level)
        else:
            raise InvalidArgument(
                f"invalid trace level '{level}': expected OFF, TIMESTAMPS or TENSORS"
            )
    return [level for level in LEVELS if level in chosen]


def _number(key: str, text: str, http: bool) -> int:
    found = _LEADING_INTEGER.match(text)
    if found is None:
        raise InvalidArgument(f"Unable to parse '{key}', got: {text}")
    value = int(found.group(1))
    least, most = _RANGES[key]
    if key == "trace_count" and _INT32[0] <= value < least:
        gap = "" if http else " "  # (Triton's two texts differ by this space)
        raise InvalidArgument(
            f"Unable to parse '{key}'. Expecting value >= {least}, got:{gap}{text}"
        )
    if not _INT32[0] <= value <= _INT32[1] or value < least:
        raise InvalidArgument(
            f"Unable to parse '{key}', value is out of range [ {least}, {most} ], got: {text}"
        )
    return value


def to_grpc(current: Mapping[str, Any]) -> pb.TraceSettingResponse:
    """Every setting as the RPC answers it: each a list of strings."""
    response = pb.TraceSettingResponse()
    for key, value in current.items():
        response.settings[key].value.extend(value if isinstance(value, list) else [value])
    return response
