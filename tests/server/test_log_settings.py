"""The logging extension's checks, as Triton makes them: HTTP JSON bodies and gRPC requests
(texts of each transport), and the gRPC answer's typed values."""

from __future__ import annotations

from typing import Any

import pytest

from server import log_settings
from server.errors import InvalidArgument, Unsupported
from server.generated import grpc_service_pb2 as pb


def test_json_changes_skip_nulls_and_unknown_names() -> None:
    body = {"log_info": False, "log_warning": None, "log_verbose_level": 4, "log_format": "ISO8601",
            "log_file": None, "log_colour": "blue"}
    assert log_settings.from_json(body) == {
        "log_info": False, "log_verbose_level": 4, "log_format": "ISO8601"
    }
    assert log_settings.from_json({}) == {}


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"log_file": ""}, Unsupported(log_settings.FILE_REFUSED)),
        ({"log_warning": 0}, InvalidArgument("attempt to access JSON non-boolean as boolean")),
        ({"log_verbose_level": 1.0},
         InvalidArgument("attempt to access JSON non-unsigned-integer as unsigned-integer")),
        ({"log_verbose_level": 1 << 32},
         InvalidArgument("attempt to access JSON non-unsigned-integer as unsigned-integer")),
        ({"log_format": None, "log_info": "yes"},
         InvalidArgument("attempt to access JSON non-boolean as boolean")),
        ({"log_format": "Default"}, InvalidArgument("invalid argument for --log_format, got: Default")),
    ],
)
def test_json_refusals(body: dict[str, Any], error: Exception) -> None:
    with pytest.raises(type(error)) as raised:
        log_settings.from_json(body)
    assert str(raised.value) == str(error)


def _request(**values: Any) -> pb.LogSettingsRequest:
    request = pb.LogSettingsRequest()
    for key, value in values.items():
        if value is None:
            request.settings[key].Clear()
        elif isinstance(value, bool):
            request.settings[key].bool_param = value
        elif isinstance(value, int):
            request.settings[key].uint32_param = value
        else:
            request.settings[key].string_param = value
    return request


def test_grpc_changes() -> None:
    request = _request(log_error=False, log_verbose_level=2, log_format="default", other=True)
    assert log_settings.from_grpc(request.settings) == {
        "log_error": False, "log_verbose_level": 2, "log_format": "default"
    }


@pytest.mark.parametrize(
    ("values", "error"),
    [
        ({"log_file": None}, Unsupported(log_settings.FILE_REFUSED)),
        ({"log_info": None}, InvalidArgument("expect boolean for 'log_info'")),
        ({"log_warning": "true"}, InvalidArgument("expect boolean for 'log_warning'")),
        ({"log_verbose_level": False}, InvalidArgument("expect int32 for 'log_verbose_level'")),
        ({"log_format": 1}, InvalidArgument("expect string for 'log_format'")),
        ({"log_format": "ISO"}, InvalidArgument("invalid argument for log_format, got: ISO")),
    ],
)
def test_grpc_refusals(values: dict[str, Any], error: Exception) -> None:
    with pytest.raises(type(error)) as raised:
        log_settings.from_grpc(_request(**values).settings)
    assert str(raised.value) == str(error)


def test_grpc_answer_types_each_value() -> None:
    answer = log_settings.to_grpc(
        {"log_file": "", "log_info": True, "log_verbose_level": 0, "log_format": "default"}
    )
    kinds = {k: v.WhichOneof("parameter_choice") for k, v in answer.settings.items()}
    assert kinds == {
        "log_file": "string_param", "log_info": "bool_param",
        "log_verbose_level": "uint32_param", "log_format": "string_param",
    }
    assert answer.settings["log_info"].bool_param is True
