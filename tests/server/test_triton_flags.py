"""Every tritonserver option is known, and each one is implemented, warned about or refused."""

from __future__ import annotations

import pytest

from server import triton_flags
from server.cli import build_parser, parse_command_line
from server.triton_flags import TRITON_FLAGS, Support

#: The options of ``tritonserver --help`` (Triton 2.51), in its order, plus ``--version``.
TRITONSERVER_2_51_OPTIONS = (
    "--help", "--id", "--exit-timeout-secs",
    "--log-verbose", "--log-info", "--log-warning", "--log-error", "--log-format", "--log-file",
    "--model-store", "--model-repository", "--exit-on-error", "--disable-auto-complete-config",
    "--strict-readiness", "--model-control-mode", "--repository-poll-secs", "--load-model",
    "--model-config-name", "--model-load-thread-count", "--model-load-retry-count",
    "--model-namespacing", "--enable-peer-access",
    "--allow-http", "--http-address", "--http-port", "--reuse-http-port",
    "--http-header-forward-pattern", "--http-thread-count", "--http-restricted-api",
    "--allow-grpc", "--grpc-address", "--grpc-port", "--reuse-grpc-port",
    "--grpc-header-forward-pattern", "--grpc-infer-allocation-pool-size", "--grpc-use-ssl",
    "--grpc-use-ssl-mutual", "--grpc-server-cert", "--grpc-server-key", "--grpc-root-cert",
    "--grpc-infer-response-compression-level", "--grpc-keepalive-time",
    "--grpc-keepalive-timeout", "--grpc-keepalive-permit-without-calls",
    "--grpc-http2-max-pings-without-data", "--grpc-http2-min-recv-ping-interval-without-data",
    "--grpc-http2-max-ping-strikes", "--grpc-max-connection-age",
    "--grpc-max-connection-age-grace", "--grpc-restricted-protocol",
    "--allow-sagemaker", "--sagemaker-port", "--sagemaker-safe-port-range",
    "--sagemaker-thread-count",
    "--allow-vertex-ai", "--vertex-ai-port", "--vertex-ai-thread-count",
    "--vertex-ai-default-model",
    "--allow-metrics", "--allow-gpu-metrics", "--allow-cpu-metrics", "--metrics-address",
    "--metrics-port", "--metrics-interval-ms", "--metrics-config",
    "--trace-config", "--backend-directory", "--backend-config", "--repoagent-directory",
    "--cache-config", "--cache-directory", "--rate-limit", "--rate-limit-resource",
    "--pinned-memory-pool-byte-size", "--cuda-memory-pool-byte-size",
    "--cuda-virtual-address-size", "--min-supported-compute-capability",
    "--buffer-manager-thread-count", "--host-policy", "--model-load-gpu-limit",
    "--strict-model-config", "--response-cache-byte-size", "--trace-file", "--trace-level",
    "--trace-rate", "--trace-count", "--trace-log-frequency",
    "--version",
)
#: Options of tensorgate's own, beyond tritonserver's.
TENSORGATE_ONLY = {
    "--frontends", "--allow-client-shm", "--http-max-header-size", "--http-max-input-size",
    "--http-idle-timeout-secs", "--http-body-timeout-secs", "--http-max-inflight-bytes",
}
#: A value each kind of option takes.
SAMPLE = {"bool": "true", "int": "3", "float": "7.5", "str": "x"}


def _kind(support: Support) -> list[str]:
    return sorted(n for n, c in TRITON_FLAGS.items() if c.support is support)


def _parser_options() -> set[str]:
    return {o for a in build_parser()._actions for o in a.option_strings if o.startswith("--")}


def test_the_table_holds_every_tritonserver_option() -> None:
    assert len(TRITONSERVER_2_51_OPTIONS) == 88 == len(set(TRITONSERVER_2_51_OPTIONS))
    assert set(TRITON_FLAGS) == set(TRITONSERVER_2_51_OPTIONS)


def test_the_parser_knows_every_option_and_no_other() -> None:
    assert _parser_options() == set(TRITON_FLAGS) | TENSORGATE_ONLY


def test_each_kind_has_what_its_messages_need() -> None:
    for name, compat in TRITON_FLAGS.items():
        assert compat.value in SAMPLE, name
        if compat.support is Support.IMPLEMENTED:
            assert not compat.why and not compat.harmless, name
        else:
            assert compat.why and not compat.why.endswith("."), name
        if compat.support is not Support.REFUSED:
            assert not compat.harmless, name
    counts = {kind: len(_kind(kind)) for kind in Support}
    assert counts == {Support.IMPLEMENTED: 60, Support.IGNORED: 19, Support.REFUSED: 9}


@pytest.mark.parametrize("name", _kind(Support.IGNORED))
def test_an_ignored_option_is_accepted_in_both_forms_with_one_warning(name: str) -> None:
    value = SAMPLE[TRITON_FLAGS[name].value]
    for words in ([f"{name}={value}"], [name, value], [f"{name}={value}", name, value]):
        command_line = parse_command_line(["--model-repository=/m", *words], environ={})
        assert command_line.warnings == (
            f"{name}={value} has no effect in tensorgate (ignored): {TRITON_FLAGS[name].why}",
        )


@pytest.mark.parametrize("name", _kind(Support.REFUSED))
def test_a_refused_option_stops_the_start_naming_it(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    compat = TRITON_FLAGS[name]
    value = "true" if compat.value == "bool" else {"int": "5"}.get(compat.value, "on")
    with pytest.raises(SystemExit) as exc:
        parse_command_line(["--model-repository=/m", f"{name}={value}"], environ={})
    assert exc.value.code == 1
    assert capsys.readouterr().err == (
        f"Error: {name}={value} is not supported by tensorgate: {compat.why}\n"
    )


@pytest.mark.parametrize(
    "name", [n for n in _kind(Support.REFUSED) if TRITON_FLAGS[n].harmless]
)
def test_a_refused_option_at_its_harmless_value_is_only_warned_about(name: str) -> None:
    (value,) = TRITON_FLAGS[name].harmless
    shown = value.upper() if name.startswith("--trace") else value  # any case
    command_line = parse_command_line(["--model-repository=/m", f"{name}={shown}"], environ={})
    assert command_line.warnings == (
        f"{name}={shown} has no effect in tensorgate (ignored): {TRITON_FLAGS[name].why}",
    )


def test_a_harmless_value_does_not_cover_a_harmful_one(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_command_line(
            ["--model-repository=/m", "--allow-sagemaker=false", "--allow-sagemaker"], environ={}
        )
    assert exc.value.code == 1
    assert "--allow-sagemaker=true is not supported" in capsys.readouterr().err


def test_values_parse_as_tritons(capsys: pytest.CaptureFixture[str]) -> None:
    for words in (["--http-thread-count=many"], ["--allow-sagemaker=perhaps"],
                  ["--min-supported-compute-capability=new"], ["--trace-rate"]):
        with pytest.raises(SystemExit) as exc:
            parse_command_line(["--model-repository=/m", *words], environ={})
        assert exc.value.code == 2, words
        assert words[0].partition("=")[0] in capsys.readouterr().err


def test_warnings_follow_the_tables_order_one_per_option() -> None:
    command_line = parse_command_line(
        ["--model-repository=/m", "--rate-limit=off", "--http-thread-count=2",
         "--http-thread-count=4", "--backend-directory=/opt/b"],
        environ={},
    )
    assert [w.partition(" ")[0] for w in command_line.warnings] == [
        "--http-thread-count", "--backend-directory=/opt/b", "--rate-limit=off",
    ]


@pytest.mark.parametrize("flag", ["--model-repository", "--model-store"])
@pytest.mark.parametrize("path", ["s3://bucket/models", "gs://bucket/m", "as://account/c/m"])
def test_cloud_repositories_are_refused_naming_the_flag_as_written(
    flag: str, path: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_command_line(["--model-store=/m", f"{flag}={path}", "--model-repository=/n"],
                           environ={})
    assert exc.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith(f"Error: {flag}={path} is not supported by tensorgate: ")
    assert err.count("\n") == 1


def test_both_repository_flags_add_up() -> None:
    settings = parse_command_line(
        ["--model-store=/a", "--model-repository", "/b", "--model-store", "/c"], environ={}
    ).settings
    assert settings.model_repositories == ("/a", "/b", "/c")
    from_environment = parse_command_line([], environ={"TENSORGATE_MODEL_STORE": "/a;/b"})
    assert from_environment.settings.model_repositories == ("/a", "/b")


def test_vertex_ai_mode_from_the_environment_is_refused_unless_turned_off(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as exc:
        parse_command_line(["--model-repository=/m"], environ={"AIP_MODE": "PREDICTION"})
    assert exc.value.code == 1
    assert "--allow-vertex-ai=false" in capsys.readouterr().err
    parse_command_line(
        ["--model-repository=/m", "--allow-vertex-ai=false"], environ={"AIP_MODE": "PREDICTION"}
    )


def test_help_says_what_each_option_does_here() -> None:
    text = build_parser().format_help()
    flat = " ".join(text.split())
    for name, compat in triton_flags.not_implemented().items():
        assert name in text
        assert " ".join(triton_flags.help_text(compat).split()) in flat, name
        assert triton_flags.help_text(compat).startswith(
            "Refused" if compat.support is Support.REFUSED else "No effect"
        )
