"""``--trace-config`` and the deprecated ``--trace-*`` flags, read as tritonserver 2.51 reads
them; the values it refuses, with its texts."""

from __future__ import annotations

import pytest

from server.cli import parse_command_line
from server.tracing.config import TraceConfig, TraceConfigError, parse


def _config(*flags: str) -> TraceConfig:
    return parse_command_line(["--model-repository=/m", *flags], environ={}).settings.trace


def test_tracing_is_off_by_default_with_tritons_defaults() -> None:
    assert _config() == TraceConfig((), 1000, -1, 0, "", "triton", ())


def test_the_documented_triton_launch_line() -> None:
    config = _config(
        "--trace-config", "triton,file=/tmp/trace.json", "--trace-config",
        "triton,log-frequency=50", "--trace-config", "rate=100", "--trace-config",
        "level=TIMESTAMPS", "--trace-config=count=100",
    )
    assert config == TraceConfig(("TIMESTAMPS",), 100, 100, 50, "/tmp/trace.json", "triton", ())


def test_levels_add_up_in_any_case_and_off_anywhere_wins() -> None:
    assert _config("--trace-config=level=tensors", "--trace-level=on").level == (
        "TIMESTAMPS", "TENSORS",
    )
    assert _config("--trace-config=level=TIMESTAMPS", "--trace-config=level=OFF").level == ()
    assert _config("--trace-level=false", "--trace-config=level=max").level == ()


def test_deprecated_flags_and_trace_config_winning_over_them() -> None:
    config = _config(
        "--trace-file=/a", "--trace-level=TIMESTAMPS", "--trace-rate=7", "--trace-count=3",
        "--trace-log-frequency=2",
    )
    assert config == TraceConfig(("TIMESTAMPS",), 7, 3, 2, "/a", "triton", ())
    config = _config("--trace-file=/a", "--trace-rate=7", "--trace-config=triton,file=/b",
                     "--trace-config=rate=9")
    assert (config.file, config.rate) == ("/b", 9)


def test_the_deprecated_flags_are_warned_about() -> None:
    command_line = parse_command_line(
        ["--model-repository=/m", "--trace-file=/a", "--trace-rate=2", "--trace-config=rate=3"],
        environ={},
    )
    assert command_line.warnings == (
        "--trace-file is deprecated: use --trace-config triton,file=<path> instead",
        "--trace-rate is deprecated: use --trace-config rate=<rate> instead",
    )


def test_opentelemetry_mode_with_its_settings_and_processor_defaults() -> None:
    config = parse(
        ["mode=opentelemetry", "opentelemetry,url=http://collector:4318/v1/traces",
         "opentelemetry,resource=service.name=mine", "opentelemetry,bsp_schedule_delay=10",
         "level=TIMESTAMPS", "triton,file=/ignored"],
        {},
        {"OTEL_BSP_MAX_QUEUE_SIZE": "99"},
    )
    assert config.mode == "opentelemetry" and config.file == ""
    assert config.options == (
        ("url", "http://collector:4318/v1/traces"), ("resource", "service.name=mine"),
        ("bsp_schedule_delay", "10"), ("bsp_max_queue_size", "99"),
        ("bsp_max_export_batch_size", "512"),
    )
    assert config.resources() == {"service.name": "mine"}
    assert config.option("url") == "http://collector:4318/v1/traces"


@pytest.mark.parametrize(
    "value, message",
    [
        ("level=loud", "invalid value for trace level option: loud"),
        ("mode=zipkin", ('invalid value for trace mode option: zipkin. Available options are '
                        '"triton" and "opentelemetry"')),
        ("jaeger,url=x", "invalid value for trace mode option: jaeger."),
        (",rate=1", ("No trace mode specified. --trace-config option format is "
                    "<trace mode>,<setting>=<value> or <setting>=<value>. Got ,rate=1")),
        ("rate", "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate"),
        ("rate=", "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate="),
        ("rate=often", 'Bad option: "--trace-config rate": not an integer: often'),
        ("count=-2", 'Bad option: "--trace-config count": -2 is not in [-1, 2147483647]'),
        ("triton,log-frequency=-1", "-1 is not in [0, 2147483647]"),
        ("colour=blue", "unknown setting 'colour'"),
        ("triton,url=x", "unknown setting 'url' (triton mode: file, log-frequency)"),
    ],
)
def test_bad_values_stop_the_start_with_one_line(
    value: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        _config(f"--trace-config={value}")
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("Error: ") and message in err and err.count("\n") == 1


def test_a_bad_processor_setting_in_opentelemetry_mode() -> None:
    with pytest.raises(TraceConfigError, match="bsp_max_queue_size"):
        parse(["mode=opentelemetry", "opentelemetry,bsp_max_queue_size=-1"], {}, {})
    with pytest.raises(TraceConfigError, match="OTEL_BSP_SCHEDULE_DELAY"):
        parse(["mode=opentelemetry"], {}, {"OTEL_BSP_SCHEDULE_DELAY": "soon"})
