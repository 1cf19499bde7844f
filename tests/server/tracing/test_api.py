"""Trace setting requests checked as Triton 2.51 checks them, over HTTP (JSON) and gRPC."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from server.errors import InvalidArgument, Unsupported
from server.generated import grpc_service_pb2 as pb
from server.tracing import api
from server.tracing.manager import CLEAR


def _grpc(**settings: list[str]) -> dict[str, Any]:
    request = pb.TraceSettingRequest()
    for key, values in settings.items():
        request.settings[key].value.extend(values)
    return api.from_grpc(request.settings)


def test_values_are_parsed_as_stoi_parses_them() -> None:
    assert api.from_json({"trace_rate": " 12abc", "trace_count": "-1", "log_frequency": "+3"}) == {
        "trace_rate": 12, "trace_count": -1, "log_frequency": 3,
    }
    assert _grpc(trace_rate=["5"], trace_level=["TENSORS", "TIMESTAMPS"]) == {
        "trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": 5,
    }


def test_null_over_http_and_empty_over_grpc_clear() -> None:
    keys = ("trace_level", "trace_rate", "trace_count", "log_frequency")
    assert api.from_json(dict.fromkeys(keys)) == dict.fromkeys(keys, CLEAR)
    assert _grpc(**{key: [] for key in keys}) == dict.fromkeys(keys, CLEAR)
    assert api.from_json({"trace_level": []}) == {}  # (changes nothing, as in Triton)


def test_the_trace_file_cannot_be_changed() -> None:
    attempt: Callable[[], object]
    for attempt in (lambda: api.from_json({"trace_file": None}),
                    lambda: _grpc(trace_file=["x"])):
        with pytest.raises(Unsupported, match=api.FILE_REFUSED):
            attempt()


@pytest.mark.parametrize(
    "body, message",
    [
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "Expect only one trace level 'OFF' is specified"),
        ({"trace_level": ["LOUD"]},
         "invalid trace level 'LOUD': expected OFF, TIMESTAMPS or TENSORS"),
        ({"trace_level": "TIMESTAMPS"}, "attempt to access JSON non-array as array"),
        ({"trace_level": [1]}, "attempt to access JSON non-string as string"),
        ({"trace_rate": 5}, "attempt to access JSON non-string as string"),
        ({"trace_rate": "often"}, "Unable to parse 'trace_rate', got: often"),
        ({"trace_rate": "-1"}, ("Unable to parse 'trace_rate', value is out of range "
                               "[ 0, 4294967295 ], got: -1")),
        ({"log_frequency": "99999999999"}, ("Unable to parse 'log_frequency', value is out of "
                                           "range [ 0, 4294967295 ], got: 99999999999")),
        ({"trace_count": "-2"}, "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
        ({"trace_count": "3000000000"}, ("Unable to parse 'trace_count', value is out of range "
                                        "[ -1, 2147483647 ], got: 3000000000")),
    ],
)
def test_http_refusals_with_tritons_texts(body: dict[str, Any], message: str) -> None:
    with pytest.raises(InvalidArgument) as exc:
        api.from_json(body)
    assert exc.value.message == message


def test_grpc_refusals_with_tritons_texts() -> None:
    with pytest.raises(InvalidArgument, match="^expect only 1 value for 'trace_rate'$"):
        _grpc(trace_rate=["1", "2"])
    with pytest.raises(InvalidArgument) as exc:
        _grpc(trace_count=["-5"])
    assert exc.value.message == "Unable to parse 'trace_count'. Expecting value >= -1, got: -5"


def test_answers_over_grpc_are_lists_of_strings() -> None:
    answer = api.to_grpc({"trace_level": ["TIMESTAMPS", "TENSORS"], "trace_rate": "1"})
    assert list(answer.settings["trace_level"].value) == ["TIMESTAMPS", "TENSORS"]
    assert list(answer.settings["trace_rate"].value) == ["1"]
