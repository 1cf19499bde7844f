"""tritonserver-compatible command line: a Triton launch line works unchanged.

Flags take tritonserver's names and value forms: ``--flag value`` and ``--flag=value`` both
parse, booleans are ``true|false`` values (a bare boolean flag means true).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from server import restricted, tls
from server.settings import (
    DEFAULT_CUDA_POOL_BYTES,
    DEFAULT_HTTP_BODY_TIMEOUT_SECS,
    DEFAULT_HTTP_IDLE_TIMEOUT_SECS,
    DEFAULT_HTTP_MAX_HEADER_SIZE,
    DEFAULT_HTTP_MAX_INFLIGHT_BYTES,
    DEFAULT_HTTP_MAX_INPUT_SIZE,
    DEFAULT_PINNED_POOL_BYTES,
    Settings,
)

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


def _backend_config(text: str) -> tuple[str, str, str]:
    backend, sep, setting = text.partition(",")
    key, eq, value = setting.partition("=")
    if not sep or not eq or not backend or not key:
        raise argparse.ArgumentTypeError(
            f"invalid --backend-config {text!r}: expected <backend>,<key>=<value>"
        )
    return backend, key, value


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorgate",
        description=(
            "CUDA-first inference server speaking the KServe V2 / Triton protocols. "
            "Serves a Triton-style model repository of ONNX models."
        ),
        allow_abbrev=False,
    )
    flag = parser.add_argument

    def bool_flag(name: str, default: bool, help_text: str) -> None:
        flag(name, type=parse_bool, nargs="?", const=True, default=default,
             metavar="true|false", help=f"{help_text} (default: {str(default).lower()})")

    flag("--model-repository", "--model-store", dest="model_repository", action="append",
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
    bool_flag("--allow-metrics", True, "Serve Prometheus metrics at /metrics")
    bool_flag("--allow-gpu-metrics", True, "Export GPU metrics (NVML) when there are GPUs")
    bool_flag("--allow-cpu-metrics", True, "Export CPU utilization and memory metrics")
    flag("--metrics-address", default=None, metavar="ADDR",
         help="Metrics listen address (default: the HTTP address)")
    flag("--metrics-port", type=_port, default=8002, metavar="PORT",
         help="Metrics port; 0 picks a free port and logs it (default: 8002)")
    flag("--metrics-interval-ms", type=int, default=2000, metavar="MS",
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
    return parser


def parse_settings(argv: Sequence[str] | None = None) -> Settings:
    """Parse the command line into ``Settings``; exits with a message on bad flags."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.load_model and args.model_control_mode != "explicit":
        parser.exit(1, "Error: --load-model requires --model-control-mode=explicit.\n")
    if "*" in args.load_model and len(args.load_model) > 1:
        parser.exit(1, "Error: --load-model=* must be the only --load-model.\n")
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
            parser.exit(1, f"Error: {name} must be greater than 0.\n")
    if args.http_max_inflight_bytes < args.http_max_input_size:
        parser.exit(
            1,
            "Error: --http-max-inflight-bytes must be at least --http-max-input-size (one "
            "largest body must fit).\n",
        )
    if args.pinned_memory_pool_byte_size < 0:
        parser.exit(1, "Error: --pinned-memory-pool-byte-size must not be negative.\n")
    _secure_options(parser, args)
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
        allow_metrics=args.allow_metrics,
        metrics_address=args.metrics_address or args.http_address,
        metrics_port=args.metrics_port,
        model_control_mode=args.model_control_mode,
        load_models=tuple(args.load_model),
        repository_poll_secs=args.repository_poll_secs,
        exit_on_error=args.exit_on_error,
        strict_readiness=args.strict_readiness,
        disable_auto_complete_config=args.disable_auto_complete_config,
        exit_timeout_secs=args.exit_timeout_secs,
        log_verbose=args.log_verbose,
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
        http_restricted_apis=args.http_restricted_api,
        grpc_restricted_protocols=args.grpc_restricted_protocol,
        grpc_use_ssl=args.grpc_use_ssl,
        grpc_use_ssl_mutual=args.grpc_use_ssl_mutual,
        grpc_server_cert=args.grpc_server_cert,
        grpc_server_key=args.grpc_server_key,
        grpc_root_cert=args.grpc_root_cert,
    )
