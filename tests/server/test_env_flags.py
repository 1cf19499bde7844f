"""``TENSORGATE_<FLAG>`` variables set flags; the command line wins over them."""

from __future__ import annotations

import pytest

from server.cli import build_parser, parse_command_line
from server.env_flags import variable


def test_variable_names() -> None:
    assert variable("--http-port") == "TENSORGATE_HTTP_PORT"
    assert variable("--grpc-http2-max-ping-strikes") == "TENSORGATE_GRPC_HTTP2_MAX_PING_STRIKES"


def test_variables_set_flags() -> None:
    command_line = parse_command_line(
        [],
        environ={
            "TENSORGATE_MODEL_REPOSITORY": "/models",
            "TENSORGATE_HTTP_PORT": "9000",
            "TENSORGATE_STRICT_READINESS": "false",
            "TENSORGATE_GRPC_KEEPALIVE_TIME": "1000",
            "TENSORGATE_HTTP_THREAD_COUNT": "4",
            "TENSORGATE_CHILD": "{}",  # not a flag: other variables are left alone
            "TENSORGATE_DISABLE_CUDA": "1",
        },
    )
    settings = command_line.settings
    assert settings.model_repositories == ("/models",)
    assert settings.http_port == 9000
    assert settings.strict_readiness is False
    assert settings.grpc_keepalive.time_ms == 1000
    assert command_line.warnings[0].startswith("--http-thread-count=4 has no effect")


def test_the_command_line_wins() -> None:
    environ = {"TENSORGATE_HTTP_PORT": "9000", "TENSORGATE_MODEL_REPOSITORY": "/a;/b"}
    settings = parse_command_line(["--http-port", "7000", "--model-store=/c"], environ).settings
    assert settings.http_port == 7000
    assert settings.model_repositories == ("/c",)  # an alias counts: the values do not add up
    settings = parse_command_line(["--http-port=7001"], environ).settings
    assert settings.http_port == 7001
    assert settings.model_repositories == ("/a", "/b")


def test_repeatable_flags_split_on_semicolons() -> None:
    settings = parse_command_line(
        ["--model-control-mode=explicit"],
        environ={
            "TENSORGATE_MODEL_STORE": "/a; /b;",
            "TENSORGATE_LOAD_MODEL": "simple;mlp",
            "TENSORGATE_BACKEND_CONFIG": (
                "onnxruntime,default-max-batch-size=8;onnxruntime,intra_op_thread_count=1"
            ),
            "TENSORGATE_CUDA_MEMORY_POOL_BYTE_SIZE": "0:1000;1:2000",
        },
    ).settings
    assert settings.model_repositories == ("/a", "/b")
    assert settings.load_models == ("simple", "mlp")
    assert settings.backend_config == {
        "onnxruntime": {"default-max-batch-size": "8", "intra_op_thread_count": "1"}
    }
    assert settings.cuda_memory_pool_byte_size == {0: 1000, 1: 2000}


def test_a_flag_without_a_value_takes_a_boolean(capsys: pytest.CaptureFixture[str]) -> None:
    def disabled(value: str) -> bool:
        environ = {"TENSORGATE_DISABLE_AUTO_COMPLETE_CONFIG": value}
        return parse_command_line(["--model-repository=/m"], environ).settings \
            .disable_auto_complete_config

    assert disabled("true") and disabled("1")
    assert not disabled("false") and not disabled("0") and not disabled("")
    with pytest.raises(SystemExit) as exc:
        disabled("sometimes")
    assert exc.value.code == 2
    assert "TENSORGATE_DISABLE_AUTO_COMPLETE_CONFIG" in capsys.readouterr().err


def test_an_empty_variable_is_not_set() -> None:
    environ = {"TENSORGATE_HTTP_PORT": "", "TENSORGATE_MODEL_REPOSITORY": "/m"}
    assert parse_command_line([], environ).settings.http_port == 8000


def test_two_names_of_one_flag_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_command_line(
            [], {"TENSORGATE_MODEL_REPOSITORY": "/a", "TENSORGATE_MODEL_STORE": "/b"}
        )
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "TENSORGATE_MODEL_REPOSITORY and TENSORGATE_MODEL_STORE set the same flag" in err


def test_a_bad_value_names_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_command_line(["--model-repository=/m"], {"TENSORGATE_HTTP_PORT": "eighty"})
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --http-port: invalid port 'eighty'" in err
    assert "--http-port came from TENSORGATE_HTTP_PORT" in err


def test_a_refused_flag_from_the_environment_is_refused(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_command_line(["--model-repository=/m"], {"TENSORGATE_ALLOW_SAGEMAKER": "true"})
    assert exc.value.code == 1
    assert "--allow-sagemaker=true is not supported by tensorgate" in capsys.readouterr().err


def test_help_and_version_are_not_variables(capsys: pytest.CaptureFixture[str]) -> None:
    environ = {"TENSORGATE_HELP": "true", "TENSORGATE_VERSION": "true"}
    assert parse_command_line(["--model-repository=/m"], environ).settings.http_port == 8000
    assert capsys.readouterr().out == ""


def test_help_documents_the_variables() -> None:
    text = " ".join(build_parser().format_help().split())
    assert "TENSORGATE_HTTP_PORT=9000 for --http-port=9000" in text
    assert "A flag on the command line wins over its variable" in text
    assert "separated by ';'" in text
