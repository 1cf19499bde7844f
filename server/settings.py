"""All server options in one frozen record, built once in ``main()`` from the command line."""

from __future__ import annotations

from dataclasses import dataclass, field

from server.cpu_quota import usable_cores
from server.tracing.config import TraceConfig

DEFAULT_HTTP_MAX_INPUT_SIZE = 1 << 26  # 64 MiB, Triton's HTTP_DEFAULT_MAX_INPUT_SIZE
DEFAULT_HTTP_MAX_HEADER_SIZE = 1 << 16  # request line + headers, Tornado's default
DEFAULT_HTTP_IDLE_TIMEOUT_SECS = 300  # Tornado's own default keeps idle connections an hour
DEFAULT_HTTP_BODY_TIMEOUT_SECS = 300  # a 64 MiB body at 2 Mbit/s still arrives
DEFAULT_HTTP_MAX_INFLIGHT_BYTES = 1 << 30  # all request bodies held at once
DEFAULT_PINNED_POOL_BYTES = 1 << 28  # 256 MiB, Triton's --pinned-memory-pool-byte-size
DEFAULT_CUDA_POOL_BYTES = 1 << 26  # 64 MiB per GPU, Triton's --cuda-memory-pool-byte-size
#: HTTP bodies are read this much at a time; so a body may pass --http-max-input-size by up
#: to this before it is refused (the front end's arena makes room for it).
HTTP_CHUNK_BYTES = 1 << 16


def default_frontends() -> int:
    """One front end per core this process may use (affinity and container CPU quota), at
    least 2; 0 on a single core."""
    cores = usable_cores()
    return cores if cores >= 2 else 0


@dataclass(frozen=True)
class GrpcKeepalive:
    """The gRPC connection-keeping flags, in milliseconds; tritonserver's defaults, which are
    grpc core's. None: grpc core's own setting (no connection age limit)."""

    time_ms: int = 7_200_000  # --grpc-keepalive-time
    timeout_ms: int = 20_000  # --grpc-keepalive-timeout
    permit_without_calls: bool = False  # --grpc-keepalive-permit-without-calls
    max_pings_without_data: int = 2  # --grpc-http2-max-pings-without-data
    min_recv_ping_interval_without_data_ms: int = 300_000  # --grpc-http2-min-recv-ping-...
    max_ping_strikes: int = 2  # --grpc-http2-max-ping-strikes
    max_connection_age_ms: int | None = None  # --grpc-max-connection-age
    max_connection_age_grace_ms: int | None = None  # --grpc-max-connection-age-grace


@dataclass(frozen=True)
class Settings:
    """Options with tritonserver's names and defaults (see ``server.cli`` for the flags)."""

    model_repositories: tuple[str, ...] = ()
    server_id: str = "triton"
    allow_http: bool = True
    http_address: str = "0.0.0.0"
    http_port: int = 8000
    http_max_input_size: int = DEFAULT_HTTP_MAX_INPUT_SIZE
    http_max_header_size: int = DEFAULT_HTTP_MAX_HEADER_SIZE
    http_idle_timeout_secs: int = DEFAULT_HTTP_IDLE_TIMEOUT_SECS
    http_body_timeout_secs: int = DEFAULT_HTTP_BODY_TIMEOUT_SECS
    http_max_inflight_bytes: int = DEFAULT_HTTP_MAX_INFLIGHT_BYTES
    allow_grpc: bool = True
    grpc_address: str = "0.0.0.0"
    grpc_port: int = 8001
    grpc_keepalive: GrpcKeepalive = field(default_factory=GrpcKeepalive)
    allow_metrics: bool = True
    metrics_address: str = "0.0.0.0"
    metrics_port: int = 8002
    allow_gpu_metrics: bool = True
    allow_cpu_metrics: bool = True
    metrics_interval_ms: float = 2000
    metrics_config: dict[str, bool] = field(default_factory=dict)  # histogram_latencies, ...
    model_control_mode: str = "none"  # none | poll | explicit
    load_models: tuple[str, ...] = ()  # explicit mode: loaded at start ("*" = all)
    repository_poll_secs: int = 15
    model_config_name: str | None = None  # <model>/configs/<name>.pbtxt when the model has it
    exit_on_error: bool = True
    strict_readiness: bool = True
    disable_auto_complete_config: bool = False
    exit_timeout_secs: int = 30
    log_verbose: int = 0
    log_format: str = "default"  # default | ISO8601
    log_file: str | None = None
    log_info: bool = True  # --log-info, --log-warning, --log-error: those severities logged
    log_warning: bool = True
    log_error: bool = True
    backend_config: dict[str, dict[str, str]] = field(default_factory=dict)
    allow_client_shm: bool = False  # Triton's current default
    pinned_memory_pool_byte_size: int = DEFAULT_PINNED_POOL_BYTES
    cuda_memory_pool_byte_size: dict[int, int] = field(default_factory=dict)  # GPU -> bytes
    response_cache_byte_size: int | None = None  # the local response cache; None: none
    trace: TraceConfig = field(default_factory=TraceConfig)  # --trace-config, --trace-*
    frontends: int | None = None  # front-end processes; 0: one process; None: by the cores
    # Restricted APIs (``server.restricted``): category -> (header, value); gRPC's headers
    # carry the "triton-grpc-protocol-" prefix. gRPC TLS: PEM files (``server.tls``).
    http_restricted_apis: dict[str, tuple[str, str]] = field(default_factory=dict)
    grpc_restricted_protocols: dict[str, tuple[str, str]] = field(default_factory=dict)
    grpc_use_ssl: bool = False
    grpc_use_ssl_mutual: bool = False
    grpc_server_cert: str | None = None
    grpc_server_key: str | None = None
    grpc_root_cert: str | None = None
    #: --grpc-infer-response-compression-level: none, low, medium or high
    grpc_infer_response_compression: str = "none"

    def frontend_count(self) -> int:
        """The front-end processes to run: ``--frontends``, or by default one per usable core
        (at least 2) when there are 2 or more, none (the one-process server) on 1 core."""
        if self.frontends is not None:
            return self.frontends
        return default_frontends()

    def cuda_pool_bytes(self, device: int) -> int:
        """The device memory pool limit of GPU ``device``."""
        return self.cuda_memory_pool_byte_size.get(device, DEFAULT_CUDA_POOL_BYTES)

    def backend_option(self, backend: str, key: str, default: str) -> str:
        """A ``--backend-config=<backend>,<key>=<value>`` setting, or ``default``."""
        return self.backend_config.get(backend, {}).get(key, default)
