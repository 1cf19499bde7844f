"""The command line takes tritonserver's flags in both value forms, after an optional
``tritonserver`` word."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from server import __version__
from server import settings as settings_module
from server.cli import build_parser, parse_settings
from server.settings import DEFAULT_HTTP_MAX_INPUT_SIZE, GrpcKeepalive
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
        monkeypatch.setattr(settings_module, "usable_cores", lambda n=cores: n)
        assert default.frontend_count() == expected, cores
    assert "--frontends" in build_parser().format_help()


@pytest.mark.parametrize("value", ["-1", "two", ""])
def test_bad_frontends_are_refused(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--model-repository=/m", f"--frontends={value}"])
    assert exc.value.code == 2
    assert "--frontends" in capsys.readouterr().err


def test_grpc_response_compression_level() -> None:
    assert parse_settings(["--model-repository=/m"]).grpc_infer_response_compression == "none"
    for given, level in (("low", "low"), ("Medium", "medium"), ("HIGH", "high")):
        settings = parse_settings(
            ["--model-repository=/m", f"--grpc-infer-response-compression-level={given}"]
        )
        assert settings.grpc_infer_response_compression == level


def test_a_bad_compression_level_is_refused_with_tritons_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--model-repository=/m", "--grpc-infer-response-compression-level=max"])
    assert exc.value.code == 2
    assert "invalid argument for --grpc_infer_response_compression_level" in capsys.readouterr().err


@pytest.mark.parametrize("word", ["tritonserver", "/opt/tritonserver/bin/tritonserver"])
def test_a_leading_tritonserver_word_is_dropped(word: str) -> None:
    settings = parse_settings([word, "--model-repository=/m", "--http-port=9000"])
    assert settings.model_repositories == ("/m",) and settings.http_port == 9000


def test_a_tritonserver_word_elsewhere_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--model-repository=/m", "tritonserver"])
    assert exc.value.code == 2
    assert "unrecognized arguments: tritonserver" in capsys.readouterr().err


@pytest.mark.parametrize("words", [["--version"], ["tritonserver", "--version"]])
def test_version_prints_and_exits_0(words: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(words)
    assert exc.value.code == 0
    assert capsys.readouterr().out == f"tensorgate {__version__}\n"


@pytest.mark.parametrize("words", [["--bogus=1"], ["--model-repo=/m"], ["--http-p=1"]])
def test_unknown_and_abbreviated_flags_are_errors(
    words: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--model-repository=/m", *words])
    assert exc.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_keepalive_flags_default_to_tritons() -> None:
    keepalive = parse_settings(["--model-repository=/m"]).grpc_keepalive
    assert keepalive == GrpcKeepalive(
        time_ms=7_200_000, timeout_ms=20_000, permit_without_calls=False,
        max_pings_without_data=2, min_recv_ping_interval_without_data_ms=300_000,
        max_ping_strikes=2, max_connection_age_ms=None, max_connection_age_grace_ms=None,
    )


def test_keepalive_flags() -> None:
    keepalive = parse_settings(
        [
            "--model-repository=/m",
            "--grpc-keepalive-time=10000", "--grpc-keepalive-timeout", "5000",
            "--grpc-keepalive-permit-without-calls=1",
            "--grpc-http2-max-pings-without-data=0",
            "--grpc-http2-min-recv-ping-interval-without-data=1000",
            "--grpc-http2-max-ping-strikes=0",
            "--grpc-max-connection-age=60000", "--grpc-max-connection-age-grace=3000",
        ]
    ).grpc_keepalive
    assert keepalive == GrpcKeepalive(10_000, 5_000, True, 0, 1_000, 0, 60_000, 3_000)


@pytest.mark.parametrize(
    "flag",
    [
        "--grpc-keepalive-time=0", "--grpc-keepalive-timeout=-1",
        "--grpc-http2-max-ping-strikes=-1", "--grpc-max-connection-age=0",
        "--grpc-max-connection-age-grace=2147483648",
    ],
)
def test_keepalive_values_out_of_range_are_refused(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--model-repository=/m", flag])
    assert exc.value.code == 1
    assert capsys.readouterr().err.startswith(f"Error: {flag.partition('=')[0]} must be in [")


def test_model_config_name() -> None:
    assert parse_settings(["--model-repository=/m"]).model_config_name is None
    settings = parse_settings(["--model-repository=/m", "--model-config-name=h100"])
    assert settings.model_config_name == "h100"


@pytest.mark.parametrize("name", ["", "two words", "../up", "a/b", ".."])
def test_a_config_name_that_is_no_file_name_is_refused(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--model-repository=/m", f"--model-config-name={name}"])
    assert exc.value.code == 1
    assert "--model-config-name must be a file name" in capsys.readouterr().err


def test_log_severity_flags() -> None:
    settings = parse_settings(["--model-repository=/m"])
    assert (settings.log_info, settings.log_warning, settings.log_error) == (True, True, True)
    settings = parse_settings(
        ["--model-repository=/m", "--log-info=false", "--log-warning", "0", "--log-error=False"]
    )
    assert (settings.log_info, settings.log_warning, settings.log_error) == (False, False, False)


def test_strict_model_config_is_the_old_name_of_disable_auto_complete() -> None:
    def disabled(*words: str) -> bool:
        return parse_settings(["--model-repository=/m", *words]).disable_auto_complete_config

    assert disabled("--strict-model-config=true") and disabled("--strict-model-config")
    assert not disabled("--strict-model-config=false") and not disabled()
    assert not disabled("--disable-auto-complete-config", "--strict-model-config=false")
    assert disabled("--strict-model-config=false", "--disable-auto-complete-config")


def test_metrics_interval_takes_a_fraction_as_triton() -> None:
    assert parse_settings(["--model-repository=/m", "--metrics-interval-ms=500.5"]) \
        .metrics_interval_ms == 500.5


def test_boolean_values_as_triton_writes_them() -> None:
    for text, expected in (("true", True), ("True", True), ("1", True), ("false", False),
                           ("False", False), ("0", False)):
        assert parse_settings(["--model-repository=/m", f"--allow-grpc={text}"]) \
            .allow_grpc is expected


def test_every_flag_the_readme_names_is_known() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("## Command line"):readme.index("## Processes")]
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*[a-z0-9](?![\w*-])", section))
    named.discard("--flag")  # "--flag value" and "--flag=value", the value forms
    known = {o for a in build_parser()._actions for o in a.option_strings}
    assert named and named <= known, named - known


@pytest.mark.parametrize(
    "words, size",
    [
        ([], None),
        (["--cache-config", "local,size=1048576"], 1048576),
        (["--cache-config=local,size=4096"], 4096),
        (["--response-cache-byte-size=512"], 512),  # Triton's deprecated form
        (["--response-cache-byte-size", "512", "--cache-config=local,size=64"], 64),
        (["--cache-config=local,size=1", "--cache-config=local,size=2"], 2),
        (["--cache-config=local,size=0"], None),  # a cache of nothing is no cache
    ],
)
def test_the_response_cache_size_in_every_form(words: list[str], size: int | None) -> None:
    assert parse_settings(["--model-repository=/m", *words]).response_cache_byte_size == size


@pytest.mark.parametrize(
    "flag, text",
    [
        ("--cache-config=redis,host=localhost", "only the local cache"),
        ("--cache-config=local,capacity=5", "has only the setting size=BYTES"),
        ("--cache-config=local,size=big", "the size must be bytes"),
        ("--cache-config=local,size=-1", "must not be negative"),
        ("--response-cache-byte-size=-1", "must not be negative"),
    ],
)
def test_a_cache_setting_tensorgate_cannot_honour_stops_the_start(
    flag: str, text: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--model-repository=/m", flag])
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and text in err, err


def test_a_malformed_cache_config_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_settings(["--model-repository=/m", "--cache-config=local"])
    assert exc.value.code == 2
    assert "expected <cache>,<key>=<value>" in capsys.readouterr().err
