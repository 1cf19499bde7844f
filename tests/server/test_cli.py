"""The command line takes tritonserver's flags in both value forms."""

from __future__ import annotations

import subprocess
import sys

import pytest

from server import settings
from server.cli import build_parser, parse_settings
from server.settings import DEFAULT_HTTP_MAX_INPUT_SIZE
from tests.server_process import ROOT


def test_defaults_match_tritonserver() -> None:
    settings = parse_settings(["--model-repository=/models"])
    assert settings.model_repositories == ("/models",)
    assert (settings.http_port, settings.grpc_port, settings.metrics_port) == (8000, 8001, 8002)
    assert settings.http_address == "0.0.0.0"
    assert settings.http_max_input_size == DEFAULT_HTTP_MAX_INPUT_SIZE == 64 * 1024 * 1024
    assert settings.exit_on_error is True
    assert settings.strict_readiness is True
    assert settings.server_id == "triton"
    assert settings.log_verbose == 0
    assert settings.pinned_memory_pool_byte_size == 256 * 1024 * 1024
    assert settings.cuda_pool_bytes(0) == settings.cuda_pool_bytes(3) == 64 * 1024 * 1024


def test_both_value_forms_and_repeatable_repository() -> None:
    settings = parse_settings(
        [
            "--model-repository", "/a",
            "--model-repository=/b",
            "--http-port=9000",
            "--grpc-port", "9001",
            "--exit-on-error=false",
            "--strict-readiness", "false",
            "--id=mine",
            "--log-verbose=1",
            "--backend-config=onnxruntime,default-max-batch-size=8",
        ]
    )
    assert settings.model_repositories == ("/a", "/b")
    assert (settings.http_port, settings.grpc_port) == (9000, 9001)
    assert settings.exit_on_error is False
    assert settings.strict_readiness is False
    assert settings.server_id == "mine"
    assert settings.log_verbose == 1
    assert settings.backend_option("onnxruntime", "default-max-batch-size", "4") == "8"


def test_bare_boolean_flag_means_true() -> None:
    settings = parse_settings(["--model-repository=/m", "--exit-on-error=false", "--strict-readiness"])
    assert settings.strict_readiness is True


def test_memory_pool_flags() -> None:
    settings = parse_settings(
        [
            "--model-repository=/m",
            "--pinned-memory-pool-byte-size=1048576",
            "--cuda-memory-pool-byte-size=0:1000",
            "--cuda-memory-pool-byte-size", "2:2000",
        ]
    )
    assert settings.pinned_memory_pool_byte_size == 1 << 20
    assert settings.cuda_memory_pool_byte_size == {0: 1000, 2: 2000}
    assert settings.cuda_pool_bytes(1) == 64 * 1024 * 1024


@pytest.mark.parametrize(
    "flag",
    [
        "--exit-on-error=maybe",
        "--http-port=70000",
        "--http-port=x",
        "--cuda-memory-pool-byte-size=1000",
        "--cuda-memory-pool-byte-size=a:1",
        "--cuda-memory-pool-byte-size=0:-5",
    ],
)
def test_bad_values_are_refused(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--model-repository=/m", flag])
    assert exc.value.code == 2
    assert "error" in capsys.readouterr().err


def test_metrics_features_not_implemented_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """summary_latencies=true asks for what the server does not export: refused, named."""
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--model-repository=/m", "--metrics-config=summary_latencies=true"])
    assert exc.value.code == 2
    assert "--metrics-config summary_latencies=true is not supported yet" in capsys.readouterr().err
    settings = parse_settings(
        ["--model-repository=/m", "--metrics-config=summary_latencies=false",
         "--metrics-config=counter_latencies=false"]
    )
    assert settings.metrics_config == {"summary_latencies": False, "counter_latencies": False}


@pytest.mark.parametrize("size", ["0", "-1024"])
def test_non_positive_max_input_size_refused_at_start(size: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", "--model-repository=/m", f"--http-max-input-size={size}"],
        check=False,
        cwd=ROOT, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode != 0
    assert "Error: --http-max-input-size must be greater than 0." in result.stderr


def test_model_repository_is_required(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_settings([])
    assert "--model-repository" in capsys.readouterr().err


def test_help_documents_every_flag() -> None:
    text = build_parser().format_help()
    for flag in (
        "--model-repository", "--http-port", "--http-address", "--grpc-port", "--metrics-port",
        "--exit-on-error", "--strict-readiness", "--http-max-input-size", "--log-verbose", "--id",
    ):
        assert flag in text
    for action in build_parser()._actions:
        assert action.help, action.option_strings


def test_console_script_help_runs() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "server", "--help"], check=False, cwd=ROOT, capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0
    assert "--http-max-input-size" in result.stdout


def test_frontends_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    assert parse_settings(["--model-repository=/m"]).frontends is None
    assert parse_settings(["--model-repository=/m", "--frontends=0"]).frontend_count() == 0
    assert parse_settings(["--model-repository=/m", "--frontends", "3"]).frontend_count() == 3
    default = parse_settings(["--model-repository=/m"])
    for cores, expected in ((1, 0), (2, 2), (3, 3), (16, 16)):
        monkeypatch.setattr(settings, "usable_cores", lambda n=cores: n)
        assert default.frontend_count() == expected, cores
    assert "--frontends" in build_parser().format_help()


@pytest.mark.parametrize("value", ["-1", "two", ""])
def test_bad_frontends_are_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--model-repository=/m", f"--frontends={value}"])
    assert exc.value.code == 2
    assert "--frontends" in capsys.readouterr().err
