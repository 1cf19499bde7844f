"""tritonserver-compatible command line: a Triton launch line works unchanged.

Flags take tritonserver's names and value forms: ``--flag value`` and ``--flag=value`` both
parse, booleans are ``true|false`` values (a bare boolean flag means true). A leading
``tritonserver`` word is dropped (``tensorgate tritonserver --model-repository=/m``), since
Helm charts and Triton images put the program's name first in the container's arguments.
Every tritonserver option is known: ``server.triton_flags`` says which ones are implemented,
which are accepted with a warning and which are refused. ``server.env_flags`` adds flags from
``TENSORGATE_<FLAG>`` variables.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

from server import __version__, compression, restricted, tls, triton_flags
from server.env_flags import EPILOG, EnvironmentFlagError, flags_from_environment
from server.settings import (
    DEFAULT_CUDA_POOL_BYTES,
    DEFAULT_HTTP_BODY_TIMEOUT_SECS,
    DEFAULT_HTTP_IDLE_TIMEOUT_SECS,
    DEFAULT_HTTP_MAX_HEADER_SIZE,
    DEFAULT_HTTP_MAX_INFLIGHT_BYTES,
    DEFAULT_HTTP_MAX_INPUT_SIZE,
    DEFAULT_PINNED_POOL_BYTES,
    GrpcKeepalive,
    Settings,
)
from server.tracing import config as tracing_config

#: The words a launch line may start with before the flags.
PROGRAM_WORDS = ("tritonserver",)
_INT32_MAX = 2**31 - 1  # grpc core's channel arguments are C ints

_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off"}


def parse_bool(text: str) -> bool:
    """Parse a tritonserver boolean value."""
    value = text.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise argparse.ArgumentTypeError(f"invalid boolean value {text!r}: use true or false")


def _port(text: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid port {text!r}") from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"port {port} is out of range [0, 65535]")
    return port


def _frontends(text: str) -> int:
    try:
        count = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"invalid --frontends {text!r}") from None
    if count < 0:
        raise argparse.ArgumentTypeError(f"--frontends {count} is negative")
    return count


def _compression_level(text: str) -> str:
    """A ``--grpc-infer-response-compression-level``, any case, as tritonserver takes it."""
    level = text.lower()
    if level not in compression.GRPC_LEVELS:
        raise argparse.ArgumentTypeError(
            "invalid argument for --grpc_infer_response_compression_level"
        )
    return level


def _named_setting(text: str, flag: str, what: str) -> tuple[str, str, str]:
    """``<what>,<key>=<value>``, the form of ``--backend-config`` and ``--cache-config``."""
    name, sep, setting = text.partition(",")
    key, eq, value = setting.partition("=")
    if not sep or not eq or not name or not key:
        raise argparse.ArgumentTypeError(
            f"invalid {flag} {text!r}: expected <{what}>,<key>=<value>"
        )
    return name, key, value


def _backend_config(text: str) -> tuple[str, str, str]:
    return _named_setting(text, "--backend-config", "backend")


def _cuda_pool(text: str) -> tuple[int, int]:
    device, sep, size = text.partition(":")
    try:
        if not sep:
            raise ValueError
        parsed = int(device), int(size)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"invalid --cuda-memory-pool-byte-size {text!r}: expected <gpu>:<bytes>"
        ) from None
    if parsed[0] < 0 or parsed[1] < 0:
        raise argparse.ArgumentTypeError(f"--cuda-memory-pool-byte-size {text!r} is negative")
    return parsed


def _cache_config(text: str) -> tuple[str, str, str]:
    """``--cache-config <cache>,<key>=<value>``; only the local cache exists here."""
    return _named_setting(text, "--cache-config", "cache")


_METRICS_CONFIG_KEYS = ("histogram_latencies", "summary_latencies", "counter_latencies")


def _metrics_config(text: str) -> tuple[str, bool]:
    key, eq, value = text.partition("=")
    if not eq or key not in _METRICS_CONFIG_KEYS:
        raise argparse.ArgumentTypeError(
            f"invalid --metrics-config {text!r}: expected one of "
            f"{', '.join(_METRICS_CONFIG_KEYS)}=true|false"
        )
    enabled = parse_bool(value)
    if key == "summary_latencies" and enabled:  # asked for, so not to be left out silently
        raise argparse.ArgumentTypeError(
            "--metrics-config summary_latencies=true is not supported yet (latency summaries); "
            "histogram_latencies=true gives the quantiles through histogram_quantile"
        )
    return key, enabled


class _UseSslMutual(argparse.Action):
    """``--grpc-use-ssl-mutual``: as tritonserver does, giving it (whatever its value) also
    sets ``--grpc-use-ssl``; a later ``--grpc-use-ssl=false`` turns TLS off again."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: object,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.grpc_use_ssl = True


class _Repository(argparse._AppendAction):
    """``--model-repository`` / ``--model-store``: repeatable (an append action, as
    ``server.env_flags`` needs it); also keeps the name each path was given under, so that a
    refusal names the flag as the launch line wrote it."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        super().__call__(parser, namespace, values, option_string)
        named = getattr(namespace, "model_repository_flags", None) or []
        namespace.model_repository_flags = [*named, option_string or "--model-repository"]


def _secure_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Check the restricted-API groups (tritonserver's texts) and the TLS files at start-up;
    exits 1 naming what is wrong."""
    try:
        args.http_restricted_api = restricted.parse_groups(
            args.http_restricted_api, "http-restricted-api", "api"
        )
        args.grpc_restricted_protocol = restricted.parse_groups(
            args.grpc_restricted_protocol, "grpc-restricted-protocol", "protocol",
            restricted.GRPC_HEADER_PREFIX,
        )
    except ValueError as exc:
        parser.exit(1, f"{exc}\n")
    if args.allow_grpc:
        try:
            tls.read_files(
                args.grpc_use_ssl, args.grpc_use_ssl_mutual, args.grpc_server_cert,
                args.grpc_server_key, args.grpc_root_cert,
            )
        except tls.TlsError as exc:
            parser.exit(1, f"Error: {exc}\n")


class _Parser(argparse.ArgumentParser):
    """An error about a flag set from the environment also names the variable."""

    def __init__(self, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.from_environment: dict[str, str] = {}  # option -> its variable

    def error(self, message: str) -> NoReturn:
        notes = [f"{option} came from {name}" for option, name in self.from_environment.items()
                 if option in message]
        super().error("; ".join([message, *notes]))


def build_parser() -> _Parser:
    parser = _Parser(
        prog="tensorgate",
        usage="%(prog)s [tritonserver] --model-repository=PATH [options]",
        description=(
            "CUDA-first inference server speaking the KServe V2 / Triton protocols. "
            "Serves a Triton-style model repository of ONNX models. A leading 'tritonserver' "
            "word is accepted and dropped."
        ),
        epilog=EPILOG,
        allow_abbrev=False,
    )
    flag = parser.add_argument
    flag("--version", action="version", version=f"tensorgate {__version__}",
         help="Print the version and exit")

    def bool_flag(name: str, default: bool, help_text: str) -> None:
        flag(name, type=parse_bool, nargs="?", const=True, default=default,
             metavar="true|false", help=f"{help_text} (default: {str(default).lower()})")

    flag("--model-repository", "--model-store", dest="model_repository", action=_Repository,
         required=True, metavar="PATH",
         help="Model repository folder; repeat for several (required)")
    flag("--id", dest="server_id", default="triton", metavar="NAME",
         help="Server name reported by server metadata (default: triton)")
    bool_flag("--allow-http", True, "Serve the HTTP/REST endpoint")
    flag("--http-address", default="0.0.0.0", metavar="ADDR",
         help="HTTP listen address (default: 0.0.0.0)")
    flag("--http-port", type=_port, default=8000, metavar="PORT",
         help="HTTP port; 0 picks a free port and logs it (default: 8000)")
    flag("--http-max-input-size", type=int, default=DEFAULT_HTTP_MAX_INPUT_SIZE,
         metavar="BYTES",
         help="Largest HTTP request body, also after decompression (default: 67108864)")
    flag("--http-max-header-size", type=int, default=DEFAULT_HTTP_MAX_HEADER_SIZE,
         metavar="BYTES",
         help=f"Largest HTTP request line plus headers (default: {DEFAULT_HTTP_MAX_HEADER_SIZE})")
    flag("--http-idle-timeout-secs", type=int, default=DEFAULT_HTTP_IDLE_TIMEOUT_SECS,
         metavar="SECS",
         help="Close a keep-alive connection idle this long, or one whose headers take this "
              f"long to arrive (default: {DEFAULT_HTTP_IDLE_TIMEOUT_SECS})")
    flag("--http-body-timeout-secs", type=int, default=DEFAULT_HTTP_BODY_TIMEOUT_SECS,
         metavar="SECS",
         help="Close a connection whose request body takes longer than this to arrive "
              f"(default: {DEFAULT_HTTP_BODY_TIMEOUT_SECS})")
    flag("--http-max-inflight-bytes", type=int, default=DEFAULT_HTTP_MAX_INFLIGHT_BYTES,
         metavar="BYTES",
         help="Host buffer bytes held at once: request bodies arriving or in use, and GPU "
              "instances' outputs until they are written; past it new requests get 503 "
              f"(default: {DEFAULT_HTTP_MAX_INFLIGHT_BYTES})")
    bool_flag("--allow-grpc", True, "Serve the gRPC endpoint")
    flag("--grpc-address", default="0.0.0.0", metavar="ADDR",
         help="gRPC listen address (default: 0.0.0.0)")
    flag("--grpc-port", type=_port, default=8001, metavar="PORT",
         help="gRPC port; 0 picks a free port and logs it (default: 8001)")
    _keepalive_flags(parser)
    bool_flag("--allow-metrics", True, "Serve Prometheus metrics at /metrics")
    bool_flag("--allow-gpu-metrics", True, "Export GPU metrics (NVML) when there are GPUs")
    bool_flag("--allow-cpu-metrics", True, "Export CPU utilization and memory metrics")
    flag("--metrics-address", default=None, metavar="ADDR",
         help="Metrics listen address (default: the HTTP address)")
    flag("--metrics-port", type=_port, default=8002, metavar="PORT",
         help="Metrics port; 0 picks a free port and logs it (default: 8002)")
    flag("--metrics-interval-ms", type=float, default=2000, metavar="MS",
         help="How often GPU and CPU metrics are sampled (default: 2000)")
    flag("--metrics-config", type=_metrics_config, action="append", default=[],
         metavar="KEY=VALUE",
         help="histogram_latencies=true adds latency histograms (default: false); "
              "counter_latencies=false leaves out the cumulative latency counters (default: "
              "true); summary_latencies=true is refused (not supported yet); repeatable")
    flag("--model-control-mode", choices=("none", "poll", "explicit"), default="none",
         help="none: load every model at start, no load/unload API; poll: also rescan the "
              "repository every --repository-poll-secs; explicit: load only --load-model "
              "models at start, then through the repository API (default: none)")
    flag("--load-model", dest="load_model", action="append", default=[], metavar="NAME",
         help="Explicit mode: a model to load at start; repeatable; '*' loads all")
    flag("--repository-poll-secs", type=int, default=15, metavar="SECS",
         help="Poll mode: seconds between repository rescans (default: 15)")
    bool_flag("--exit-on-error", True, "Exit when a model fails to load at start")
    bool_flag("--strict-readiness", True,
              "Ready only when every model is ready; false: ready when the server is up")
    flag("--disable-auto-complete-config", action="store_true",
         help="Do not complete missing config fields from the ONNX file")
    flag("--strict-model-config", dest="disable_auto_complete_config", type=parse_bool,
         nargs="?", const=True, metavar="true|false",
         help="Deprecated form of --disable-auto-complete-config: true disables auto-complete "
              "(default: false)")
    flag("--model-config-name", default=None, metavar="NAME",
         help="Read each model's configs/NAME.pbtxt instead of config.pbtxt where the model "
              "has one")
    flag("--exit-timeout-secs", type=int, default=30, metavar="SECS",
         help="Seconds to finish in-flight requests on shutdown (default: 30)")
    flag("--backend-config", type=_backend_config, action="append", default=[],
         metavar="BACKEND,KEY=VALUE",
         help="Backend setting, e.g. onnxruntime,default-max-batch-size=8")
    bool_flag("--allow-client-shm", False,
              "Let clients register system and CUDA shared memory regions")
    flag("--pinned-memory-pool-byte-size", type=int, default=DEFAULT_PINNED_POOL_BYTES,
         metavar="BYTES",
         help="Pinned host memory for request and copy buffers when CUDA is present; past it "
              f"buffers are pageable (default: {DEFAULT_PINNED_POOL_BYTES})")
    flag("--cuda-memory-pool-byte-size", type=_cuda_pool, action="append", default=[],
         metavar="GPU:BYTES",
         help="Device memory pool limit of one GPU; repeatable "
              f"(default: {DEFAULT_CUDA_POOL_BYTES} per GPU)")
    flag("--cache-config", type=_cache_config, action="append", default=[],
         metavar="local,size=BYTES",
         help="The response cache, shared by the models whose config enables "
              "response_cache: local,size=BYTES (default: no cache)")
    flag("--response-cache-byte-size", type=int, default=None, metavar="BYTES",
         help="Deprecated form of --cache-config local,size=BYTES")
    flag("--frontends", type=_frontends, default=None, metavar="N",
         help="Front-end processes (HTTP and gRPC) feeding one executor process that owns the "
              "models; 0 serves everything in one process (default: one per usable core, at "
              "least 2; 0 on a single core)")
    flag("--log-verbose", type=int, default=0, metavar="N",
         help="Verbose logging level; 0 is off, 1 logs every request (default: 0)")
    flag("--log-format", choices=("default", "ISO8601"), default="default",
         help="Log line prefix: default (MMDD hh:mm:ss.uuuuuu) or ISO8601 (default: default)")
    flag("--log-file", default=None, metavar="PATH",
         help="Write the log to this file instead of standard error")
    bool_flag("--log-info", True, "Log info messages")
    bool_flag("--log-warning", True, "Log warnings")
    bool_flag("--log-error", True, "Log errors")
    _trace_flags(flag)
    _not_implemented_flags(parser)
    # Restricted APIs and gRPC TLS (server.restricted, server.tls).
    categories = ", ".join(restricted.CATEGORIES)
    flag("--http-restricted-api", action="append", default=[], metavar="APIS:KEY=VALUE",
         help="HTTP requests of these comma-separated API categories must carry header KEY "
              f"with VALUE, else 403; repeatable, a category in one group only ({categories})")
    flag("--grpc-restricted-protocol", action="append", default=[],
         metavar="PROTOCOLS:KEY=VALUE",
         help="gRPC calls of these comma-separated categories must carry metadata "
              f"{restricted.GRPC_HEADER_PREFIX}KEY with VALUE, else UNAVAILABLE; repeatable, "
              f"a category in one group only ({categories})")
    bool_flag("--grpc-use-ssl", False,
              "Serve gRPC over TLS with --grpc-server-cert and --grpc-server-key")
    flag("--grpc-use-ssl-mutual", type=parse_bool, nargs="?", const=True, default=False,
         action=_UseSslMutual, metavar="true|false",
         help="TLS that also requires client certificates, verified against --grpc-root-cert; "
              "given at all (even false) it also sets --grpc-use-ssl, as in tritonserver "
              "(default: false)")
    flag("--grpc-server-cert", default=None, metavar="PATH",
         help="PEM file of the gRPC server's certificate (chain); used with --grpc-use-ssl")
    flag("--grpc-server-key", default=None, metavar="PATH",
         help="PEM file of the gRPC server's private key; used with --grpc-use-ssl")
    flag("--grpc-root-cert", default=None, metavar="PATH",
         help="PEM file of the CA certificates client certificates are checked against; used "
              "with --grpc-use-ssl-mutual")
    flag("--grpc-infer-response-compression-level", type=_compression_level, default="none",
         metavar="|".join(compression.GRPC_LEVELS),
         help="Compress ModelInfer and ModelStreamInfer responses: low with the first of gzip "
              "and deflate the client accepts, medium the middle one, high the last, as grpc "
              "core does (default: none)")
    return parser


def _keepalive_flags(parser: argparse.ArgumentParser) -> None:
    """gRPC connection keeping, tritonserver's flags and defaults (``GrpcKeepalive``)."""
    default = GrpcKeepalive()
    flag = parser.add_argument
    flag("--grpc-keepalive-time", type=int, default=default.time_ms, metavar="MS",
         help=f"Send a keepalive ping after this long (default: {default.time_ms})")
    flag("--grpc-keepalive-timeout", type=int, default=default.timeout_ms, metavar="MS",
         help="Close the connection when a keepalive ping is not answered in this long "
              f"(default: {default.timeout_ms})")
    flag("--grpc-keepalive-permit-without-calls", type=parse_bool, nargs="?", const=True,
         default=default.permit_without_calls, metavar="true|false",
         help="Send keepalive pings, and accept the client's, also while no call is in "
              "flight (default: false)")
    flag("--grpc-http2-max-pings-without-data", type=int,
         default=default.max_pings_without_data, metavar="N",
         help="Pings sent while no data is sent; 0 is no limit "
              f"(default: {default.max_pings_without_data})")
    flag("--grpc-http2-min-recv-ping-interval-without-data", type=int,
         default=default.min_recv_ping_interval_without_data_ms, metavar="MS",
         help="A client's ping sooner than this after the previous one, while no data is "
              "sent, is a strike "
              f"(default: {default.min_recv_ping_interval_without_data_ms})")
    flag("--grpc-http2-max-ping-strikes", type=int, default=default.max_ping_strikes,
         metavar="N",
         help="Strikes after which the connection is closed (GOAWAY); 0 is no limit "
              f"(default: {default.max_ping_strikes})")
    flag("--grpc-max-connection-age", type=int, default=None, metavar="MS",
         help="Ask clients to reconnect (GOAWAY) once a connection is this old "
              "(default: no limit)")
    flag("--grpc-max-connection-age-grace", type=int, default=None, metavar="MS",
         help="After the max age, close the connection once this long has passed "
              "(default: no limit)")


def _trace_flags(flag: Callable[..., object]) -> None:
    """The trace extension's start-up settings (``server.tracing.config``)."""
    flag("--trace-config", action="append", default=[], metavar="<mode>,<setting>=<value>",
         help="A trace setting: global (level=OFF|TIMESTAMPS|TENSORS, rate=N, count=N, "
              "mode=triton|opentelemetry) or of a mode (triton,file=PATH, "
              "triton,log-frequency=N, opentelemetry,url=URL, "
              "opentelemetry,resource=KEY=VALUE, opentelemetry,bsp_*=N); repeatable")
    flag("--trace-file", action="append", default=[], metavar="PATH",
         help="Deprecated form of --trace-config triton,file=PATH")
    flag("--trace-level", action="append", default=[], metavar="LEVEL",
         help="Deprecated form of --trace-config level=LEVEL")
    for name, form in (("rate", "rate=N"), ("count", "count=N"),
                       ("log-frequency", "triton,log-frequency=N")):
        flag(f"--trace-{name}", type=int, action="append", default=[], metavar="N",
             help=f"Deprecated form of --trace-config {form}")


def _not_implemented_flags(parser: argparse.ArgumentParser) -> None:
    """tritonserver's other options, from ``server.triton_flags``: parsed as Triton parses
    them, every value kept, so that start-up can warn about or refuse each."""
    group = parser.add_argument_group("tritonserver options tensorgate does not implement")
    for name, compat in triton_flags.not_implemented().items():
        add = functools.partial(
            group.add_argument, name, dest=_dest(name), action="append", default=None,
            help=triton_flags.help_text(compat),
        )
        if compat.value == "bool":
            add(type=parse_bool, nargs="?", const=True, metavar="true|false")
        elif compat.value == "int":
            add(type=int, metavar="N")
        elif compat.value == "float":
            add(type=float, metavar="X")
        else:
            add(metavar="VALUE")


def _dest(name: str) -> str:
    return "triton_" + name.removeprefix("--").replace("-", "_")


@dataclass(frozen=True)
class CommandLine:
    """The settings, and the warnings start-up logs once (by the process ``main`` runs)."""

    settings: Settings
    warnings: tuple[str, ...]


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    """Parse the command line into ``Settings``; exits with a message on bad flags."""
    return parse_command_line(argv).settings


def parse_command_line(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> CommandLine:
    """Parse the command line (after a leading ``tritonserver``) and the ``TENSORGATE_*``
    variables of ``environ`` (default: this process's); exits with a message on bad flags
    (status 2) and on what tensorgate does not do (status 1)."""
    words = list(argv if argv is not None else sys.argv[1:])
    if words and os.path.basename(words[0]) in PROGRAM_WORDS:
        words = words[1:]
    parser = build_parser()
    environ = os.environ if environ is None else environ
    try:
        extra, parser.from_environment = flags_from_environment(
            parser, words, environ, parse_bool
        )
    except EnvironmentFlagError as exc:
        parser.error(str(exc))
    args = parser.parse_args([*extra, *words])
    _check_values(parser, args)
    warnings = _triton_options(parser, args, environ)
    return CommandLine(_settings(args), warnings)


def _refuse(parser: argparse.ArgumentParser, line: str) -> NoReturn:
    parser.exit(1, f"Error: {line}\n")


def _check_values(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.load_model and args.model_control_mode != "explicit":
        _refuse(parser, "--load-model requires --model-control-mode=explicit.")
    if "*" in args.load_model and len(args.load_model) > 1:
        _refuse(parser, "--load-model=* must be the only --load-model.")
    for value, name in (
        (args.http_max_input_size, "--http-max-input-size"),
        (args.http_max_header_size, "--http-max-header-size"),
        (args.http_idle_timeout_secs, "--http-idle-timeout-secs"),
        (args.http_body_timeout_secs, "--http-body-timeout-secs"),
        (args.http_max_inflight_bytes, "--http-max-inflight-bytes"),
        (args.metrics_interval_ms, "--metrics-interval-ms"),
        (args.repository_poll_secs, "--repository-poll-secs"),
    ):
        if value <= 0:
            _refuse(parser, f"{name} must be greater than 0.")
    if args.http_max_inflight_bytes < args.http_max_input_size:
        _refuse(
            parser,
            "--http-max-inflight-bytes must be at least --http-max-input-size (one largest "
            "body must fit).",
        )
    if args.pinned_memory_pool_byte_size < 0:
        _refuse(parser, "--pinned-memory-pool-byte-size must not be negative.")
    for value, name, least in (
        (args.grpc_keepalive_time, "--grpc-keepalive-time", 1),
        (args.grpc_keepalive_timeout, "--grpc-keepalive-timeout", 1),
        (args.grpc_http2_max_pings_without_data, "--grpc-http2-max-pings-without-data", 0),
        (args.grpc_http2_min_recv_ping_interval_without_data,
         "--grpc-http2-min-recv-ping-interval-without-data", 0),
        (args.grpc_http2_max_ping_strikes, "--grpc-http2-max-ping-strikes", 0),
        (args.grpc_max_connection_age, "--grpc-max-connection-age", 1),
        (args.grpc_max_connection_age_grace, "--grpc-max-connection-age-grace", 0),
    ):
        if value is not None and not least <= value <= _INT32_MAX:
            _refuse(parser, f"{name} must be in [{least}, {_INT32_MAX}].")
    name = args.model_config_name
    if name is not None and (
        not name or name in (".", "..") or any(c.isspace() or c in "/\\\0" for c in name)
    ):
        _refuse(parser, "--model-config-name must be a file name, without spaces or slashes.")
    _secure_options(parser, args)
    args.response_cache_byte_size = _cache_size(parser, args)
    try:
        args.trace = tracing_config.parse(
            args.trace_config,
            {
                "file": args.trace_file,
                "level": args.trace_level,
                "rate": [str(v) for v in args.trace_rate],
                "count": [str(v) for v in args.trace_count],
                "log-frequency": [str(v) for v in args.trace_log_frequency],
            },
        )
    except tracing_config.TraceConfigError as exc:
        _refuse(parser, str(exc))


def _cache_size(parser: argparse.ArgumentParser, args: argparse.Namespace) -> int | None:
    """The local cache's size in bytes, or None: no cache (a size of 0 too). A
    ``--cache-config`` size wins over the deprecated flag, the last one over earlier ones."""
    size: int | None = args.response_cache_byte_size
    for cache, key, value in args.cache_config:
        if cache != "local":
            _refuse(
                parser,
                f"--cache-config={cache},{key}={value} is not supported by tensorgate: only the "
                "local cache (local,size=BYTES) is implemented",
            )
        if key != "size":
            _refuse(parser, f"--cache-config local,{key}={value}: the local cache has only "
                    "the setting size=BYTES")
        try:
            size = int(value)
        except ValueError:
            _refuse(parser, f"--cache-config local,size={value}: the size must be bytes.")
    if size is not None and size < 0:
        _refuse(parser, "the response cache size must not be negative.")
    return size or None


def _triton_options(
    parser: argparse.ArgumentParser, args: argparse.Namespace, environ: Mapping[str, str]
) -> tuple[str, ...]:
    """The warnings for tritonserver options given that have no effect here; refuses (exit
    status 1) the ones that ask for what tensorgate does not do."""
    for name, path in zip(args.model_repository_flags, args.model_repository, strict=True):
        if path.startswith(triton_flags.CLOUD_PREFIXES):
            _refuse(
                parser,
                f"{name}={path} is not supported by tensorgate: cloud storage "
                f"repositories ({', '.join(triton_flags.CLOUD_PREFIXES)}) are not "
                "implemented; mount the models as a local folder",
            )
    given = {name: getattr(args, _dest(name)) for name in triton_flags.not_implemented()}
    if environ.get("AIP_MODE") == "PREDICTION" and given["--allow-vertex-ai"] is None:
        _refuse(
            parser,
            "AIP_MODE=PREDICTION turns on tritonserver's Vertex AI endpoint, which is not "
            "supported by tensorgate: pass --allow-vertex-ai=false to serve without it",
        )
    warnings = []
    for name, values in given.items():
        if values is None:
            continue
        try:
            warnings.append(triton_flags.check(name, values))
        except triton_flags.Refusal as exc:
            _refuse(parser, str(exc))
    for name, form in _DEPRECATED_TRACE_FLAGS.items():  # as tritonserver warns
        if getattr(args, _dest(name).removeprefix("triton_")):
            warnings.append(f"{name} is deprecated: use --trace-config {form} instead")
    return tuple(warnings)


_DEPRECATED_TRACE_FLAGS = {
    "--trace-file": "triton,file=<path>",
    "--trace-level": "level=<OFF|TIMESTAMPS|TENSORS>",
    "--trace-rate": "rate=<rate>",
    "--trace-count": "count=<count>",
    "--trace-log-frequency": "triton,log-frequency=<value>",
}


def _settings(args: argparse.Namespace) -> Settings:
    backend_config: dict[str, dict[str, str]] = {}
    for backend, key, value in args.backend_config:
        backend_config.setdefault(backend, {})[key] = value
    return Settings(
        model_repositories=tuple(args.model_repository),
        server_id=args.server_id,
        allow_http=args.allow_http,
        http_address=args.http_address,
        http_port=args.http_port,
        http_max_input_size=args.http_max_input_size,
        http_max_header_size=args.http_max_header_size,
        http_idle_timeout_secs=args.http_idle_timeout_secs,
        http_body_timeout_secs=args.http_body_timeout_secs,
        http_max_inflight_bytes=args.http_max_inflight_bytes,
        allow_grpc=args.allow_grpc,
        grpc_address=args.grpc_address,
        grpc_port=args.grpc_port,
        grpc_keepalive=GrpcKeepalive(
            time_ms=args.grpc_keepalive_time,
            timeout_ms=args.grpc_keepalive_timeout,
            permit_without_calls=args.grpc_keepalive_permit_without_calls,
            max_pings_without_data=args.grpc_http2_max_pings_without_data,
            min_recv_ping_interval_without_data_ms=(
                args.grpc_http2_min_recv_ping_interval_without_data
            ),
            max_ping_strikes=args.grpc_http2_max_ping_strikes,
            max_connection_age_ms=args.grpc_max_connection_age,
            max_connection_age_grace_ms=args.grpc_max_connection_age_grace,
        ),
        allow_metrics=args.allow_metrics,
        metrics_address=args.metrics_address or args.http_address,
        metrics_port=args.metrics_port,
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_model),
        repository_poll_secs=args.repository_poll_secs,
        model_config_name=args.model_config_name,
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        disable_auto_complete_config=args.disable_auto_complete_config,
        exit_timeout_secs=args.exit_timeout_secs,
        log_verbose=args.log_verbose,
        log_info=args.log_info,
        log_warning=args.log_warning,
        log_error=args.log_error,
        backend_config=backend_config,
        allow_gpu_metrics=args.allow_gpu_metrics,
        allow_cpu_metrics=args.allow_cpu_metrics,
        metrics_interval_ms=args.metrics_interval_ms,
        metrics_config=dict(args.metrics_config),
        log_format=args.log_format,
        log_file=args.log_file,
        allow_client_shm=args.allow_client_shm,
        pinned_memory_pool_byte_size=args.pinned_memory_pool_byte_size,
        cuda_memory_pool_byte_size=dict(args.cuda_memory_pool_byte_size),
        frontends=args.frontends,
        response_cache_byte_size=args.response_cache_byte_size,
        trace=args.trace,
        http_restricted_apis=args.http_restricted_api,
        grpc_restricted_protocols=args.grpc_restricted_protocol,
        grpc_use_ssl=args.grpc_use_ssl,
        grpc_use_ssl_mutual=args.grpc_use_ssl_mutual,
        grpc_server_cert=args.grpc_server_cert,
        grpc_server_key=args.grpc_server_key,
        grpc_root_cert=args.grpc_root_cert,
        grpc_infer_response_compression=args.grpc_infer_response_compression_level,
    )
