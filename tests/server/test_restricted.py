"""``--http-restricted-api`` / ``--grpc-restricted-protocol``: parsed with tritonserver's
texts (``src/command_line_parser.cc``), refused at start-up when malformed, and the check that
both transports use (triton-facts §1.3, §7.2-7.3)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from server import restricted
from server.cli import parse_settings
from server.errors import Restricted
from tests.server_process import ROOT


def test_groups_map_each_category_to_its_header_and_value() -> None:
    table = restricted.parse_groups(
        ["model-repository:admin-key=admin-value", "inference,metadata:infer-key=a=b:c"],
        "http-restricted-api", "api",
    )
    assert table == {
        "model-repository": ("admin-key", "admin-value"),
        "inference": ("infer-key", "a=b:c"),  # the value is everything after the first '='
        "metadata": ("infer-key", "a=b:c"),
    }


def test_grpc_keys_get_the_protocol_prefix() -> None:
    table = restricted.parse_groups(
        ["health:infer-key=infer-value"], "grpc-restricted-protocol", "protocol",
        restricted.GRPC_HEADER_PREFIX,
    )
    assert table == {"health": ("triton-grpc-protocol-infer-key", "infer-value")}


def test_every_triton_category_is_known() -> None:
    assert restricted.CATEGORIES == (
        "health", "metadata", "inference", "shared-memory", "model-config", "model-repository",
        "statistics", "trace", "logging",
    )
    table = restricted.parse_groups(
        [",".join(restricted.CATEGORIES) + ":k=v"], "http-restricted-api", "api"
    )
    assert set(table) == set(restricted.CATEGORIES)


@pytest.mark.parametrize(
    "values, feature, message",
    [
        (["health:a=b", "health,metadata:c=d"], "api",
         "restricted api 'health' can not be specified in multiple config groups"),
        (["health,health:a=b"], "api",
         "restricted api 'health' can not be specified in multiple config groups"),
        (["model-reposit:a=b"], "api", "unknown restricted api 'model-reposit'"),
        (["health,:a=b"], "protocol", "unknown restricted protocol ''"),
        (["Health:a=b"], "protocol", "unknown restricted protocol 'Health'"),
    ],
)
def test_bad_categories_are_refused_with_tritons_text(
    values: list[str], feature: str, message: str
) -> None:
    with pytest.raises(ValueError) as info:
        restricted.parse_groups(values, "x", feature)
    assert str(info.value) == message


@pytest.mark.parametrize("text", ["health", "health:key", ":k=v", "health:=v", "health:k=", "k=v"])
def test_malformed_values_are_refused_with_tritons_text(text: str) -> None:
    with pytest.raises(ValueError) as info:
        restricted.parse_groups([text], "http-restricted-api", "api")
    assert str(info.value) == (
        "--http-restricted-api option format is '<config name>:<setting>=<value>'. "
        f"Got {text}"
    )


def test_refusal_needs_the_exact_value_and_names_the_header() -> None:
    http = restricted.for_http({"inference": ("infer-key", "infer-value")})
    assert http
    headers = {"infer-key": "infer-value"}
    assert http.refusal("inference", headers.get) is None
    assert http.refusal("metadata", dict[str, str]().get) is None  # not restricted
    assert http.refusal(None, dict[str, str]().get) is None  # a path of no category
    for sent in ({}, {"infer-key": "infer-valuE"}, {"infer-key": ""}, {"other": "infer-value"}):
        error = http.refusal("inference", sent.get)
        assert isinstance(error, Restricted)
        assert error.message == "This API is restricted, expecting header 'infer-key'"
        assert (error.http_status, error.grpc_status_name) == (403, "UNAVAILABLE")
    grpc = restricted.for_grpc({"health": ("triton-grpc-protocol-k", "v")})
    error = grpc.refusal("health", dict[str, str]().get)
    assert error is not None
    assert error.message == (
        "This protocol is restricted, expecting header 'triton-grpc-protocol-k'"
    )
    assert not restricted.for_http({})


def test_flags_reach_the_settings() -> None:
    settings = parse_settings(
        [
            "--model-repository=/m",
            "--http-restricted-api=model-repository:admin-key=admin-value",
            "--http-restricted-api", "inference,metadata:infer-key=infer-value",
            "--grpc-restricted-protocol=health,inference:infer-key=infer-value",
        ]
    )
    assert settings.http_restricted_apis == {
        "model-repository": ("admin-key", "admin-value"),
        "inference": ("infer-key", "infer-value"),
        "metadata": ("infer-key", "infer-value"),
    }
    assert settings.grpc_restricted_protocols == {
        "health": ("triton-grpc-protocol-infer-key", "infer-value"),
        "inference": ("triton-grpc-protocol-infer-key", "infer-value"),
    }
    assert parse_settings(["--model-repository=/m"]).http_restricted_apis == {}


def test_a_bad_group_exits_1_with_the_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(
            ["--model-repository=/m", "--grpc-restricted-protocol=trace:a=b",
             "--grpc-restricted-protocol=logging,trace:a=b"]
        )
    assert exc.value.code == 1
    assert capsys.readouterr().err == (
        "restricted protocol 'trace' can not be specified in multiple config groups\n"
    )


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--http-restricted-api=health:a=b", "--http-restricted-api=health,metadata:c=d"],
         "restricted api 'health' can not be specified in multiple config groups"),
        (["--http-restricted-api=model-reposit:a=b"], "unknown restricted api 'model-reposit'"),
    ],
)
def test_the_server_does_not_start(flags: list[str], message: str) -> None:
    """As in Triton's L0_http test.sh: start-up fails, naming the category."""
    result = subprocess.run(
        [sys.executable, "-m", "server", "--model-repository=/m", *flags],
        check=False, cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1
    assert message in result.stderr
