"""Builds the parts, loads the models, serves HTTP until SIGINT/SIGTERM, then stops cleanly:
within ``--exit-timeout-secs`` (see ``shutdown``)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from backends.base import Backend
from backends.onnxruntime.backend import OnnxRuntimeBackend
from backends.python.backend import PythonBackend
from backends.python.server_link import LINK, ServerCalls
from server import heap, restricted, tls
from server.dataplane import DataPlane
from server.errors import InferenceServerError
from server.grpc.server import GrpcServer
from server.http import endpoint
from server.http.delegates import TornadoDelegate
from server.http.endpoint import Http, start_http
from server.http.metrics import make_metrics_app
from server.memory.device_pool import DevicePools
from server.memory.host_pool import HostBufferPool
from server.observability.gpu_metrics import GpuMonitor
from server.observability.metrics import SystemSampler, render
from server.repository.manager import ModelRepository
from server.settings import Settings
from server.shutdown import Shutdown, exit_now

log = logging.getLogger("server")

_CLOSE_TIMEOUT_SECS = 5  # for connections to close once requests are done


def _initial_models(settings: Settings) -> list[str] | None:
    """The models to load at start: all of them, except in explicit mode."""
    if settings.model_control_mode != "explicit" or "*" in settings.load_models:
        return None
    return list(settings.load_models)


def _model_table(repository: ModelRepository) -> None:
    for name, model in sorted(repository.models.items()):
        if model.reason:
            log.info("model %s: UNAVAILABLE: %s", name, model.reason)
        for version, served in sorted(model.versions.items()):
            status = served.state.value + (f": {served.reason}" if served.reason else "")
            log.info("model %s version %d: %s", name, version, status)


def build_repository(settings: Settings, pool: HostBufferPool) -> ModelRepository:
    """The model repository with its backends. ONNX Runtime first: a folder with neither
    backend nor platform set is tried against each backend's default file in this order."""
    backends: list[Backend] = [
        OnnxRuntimeBackend(
            settings.backend_config.get("onnxruntime"),
            DevicePools(settings.cuda_pool_bytes),
            pool,
        ),
        PythonBackend(pool),
    ]
    return ModelRepository(settings, {backend.name: backend for backend in backends})


def connect_models(calls: ServerCalls) -> None:
    """Let python models' BLS requests and model control reach ``calls`` (the data plane) on
    this event loop."""
    LINK.connect(calls, asyncio.get_running_loop())


async def load_models(
    settings: Settings, shutdown: Shutdown, repository: ModelRepository
) -> int | None:
    """Load the models to serve at start: None to go on serving, else the exit code."""
    try:
        loaded = await shutdown.unless_stopped(repository.load_initial(_initial_models(settings)))
    except InferenceServerError as exc:
        log.error("error: %s", exc.message)
        return 1
    if not loaded:
        await repository.close(0)
        # The loads' threads cannot be stopped, and Python would wait for them at exit.
        exit_now("stopped during start-up; the model loads still running are abandoned")
    _model_table(repository)
    if repository.failed_models() and settings.exit_on_error:
        log.error("error: failed to load all models; exiting (--exit-on-error=true)")
        await repository.close()
        return 1
    return None


async def serve(settings: Settings) -> int:
    """Run the server in this one process until a stop signal; the process exit code."""
    shutdown = Shutdown(settings.exit_timeout_secs)
    shutdown.install()  # a signal during the model loads stops the start-up too
    # One pool of host buffers for both transports' request bodies and the GPU instances'
    # outputs: pinned memory, within one budget, when there is a GPU.
    pool = HostBufferPool(pinned_limit=settings.pinned_memory_pool_byte_size)
    repository = build_repository(settings, pool)
    failed = await load_models(settings, shutdown, repository)
    if failed is not None:
        return failed

    dataplane = DataPlane(settings, repository, pool)
    connect_models(dataplane)
    try:
        grpc_server = _bind_grpc(settings, dataplane, pool) if settings.allow_grpc else None
        http_server = start_http(settings, dataplane, pool) if settings.allow_http else None
        metrics = start_metrics(settings, dataplane, pool) if settings.allow_metrics else None
    except (OSError, tls.TlsError) as exc:  # a port in use, an address not ours, a PEM file gone
        log.error("error: %s", exc)
        await repository.close()
        return 1
    dataplane.set_live(True)
    if grpc_server is not None:
        await grpc_server.start()
        log.info("Started GRPCInferenceService at %s:%d", settings.grpc_address, grpc_server.port)
    heap.settle()
    poller = (
        asyncio.create_task(poll_repository(repository, settings.repository_poll_secs))
        if settings.model_control_mode == "poll"
        else None
    )

    await shutdown.requested.wait()

    log.info(
        "stopping: finishing %d in-flight requests (at most %d s; signal again to stop now)",
        dataplane.gate.inside, settings.exit_timeout_secs,
    )
    dataplane.gate.close()  # new requests get 503 / UNAVAILABLE; readiness turns false
    if poller is not None:
        poller.cancel()
    if http_server is not None:
        http_server.listener.close()  # no new connections
    if metrics is not None:
        metrics.stop()
    if grpc_server is not None:
        await grpc_server.update_health()
    finished = await dataplane.gate.wait_idle(settings.exit_timeout_secs)
    if not finished:
        log.warning("stopping with %d requests still in flight", dataplane.gate.inside)
    dataplane.set_live(False)
    if grpc_server is not None:
        await grpc_server.stop(grace_secs=0)  # RPCs still running are cancelled
    if http_server is not None:
        close_secs = min(_CLOSE_TIMEOUT_SECS, shutdown.remaining())
        try:
            await asyncio.wait_for(http_server.server.close_all_connections(), close_secs)
        except TimeoutError:
            log.warning("HTTP connections did not close within %.1f s", close_secs)
    await repository.close(None if finished else 0)
    dataplane.close()
    log.info("stopped")
    if not finished:
        # Threads still run those requests, and Python would wait for them at exit.
        exit_now("exiting without waiting for the requests still running")
    return 0


class Metrics:
    """The metrics endpoint and the CPU/GPU sampler feeding it."""

    def __init__(self, http: Http, sampler: SystemSampler, task: asyncio.Task[None]):
        self.http = http
        self.sampler = sampler
        self.task = task

    def stop(self) -> None:
        self.http.listener.close()
        self.task.cancel()
        self.sampler.close()


def start_metrics(settings: Settings, dataplane: DataPlane, pool: HostBufferPool) -> Metrics:
    gpu = GpuMonitor.start() if settings.allow_gpu_metrics else None
    sampler = SystemSampler(settings.allow_cpu_metrics, gpu)
    histograms = settings.metrics_config.get("histogram_latencies", False)
    counters = settings.metrics_config.get("counter_latencies", True)

    def page() -> str:
        return render(
            dataplane.metric_entries(), pool.stats(), sampler.latest, histograms, counters,
            cache=dataplane.cache_sample(),
        )

    http = Http(
        endpoint.service(TornadoDelegate(make_metrics_app(page))),
        settings.metrics_address,
        settings.metrics_port,
        "Metrics Service",
    )
    sampler.sample()  # the first scrape already has CPU and GPU figures
    task = asyncio.create_task(sampler.run(settings.metrics_interval_ms / 1000))
    return Metrics(http, sampler, task)


async def poll_repository(
    repository: ModelRepository,
    every_secs: int,
    after: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """Poll mode: rescan the repository folders every ``every_secs`` seconds (then ``after``:
    the executor tells its front ends)."""
    while True:
        await asyncio.sleep(every_secs)
        try:
            await repository.poll_once()
        except Exception:
            log.exception("repository poll failed")
        if after is not None:
            await after()


def _bind_grpc(settings: Settings, dataplane: DataPlane, pool: HostBufferPool) -> GrpcServer:
    server = GrpcServer(
        dataplane,
        pool,
        keepalive=settings.grpc_keepalive,
        buffers=pool,
        restrictions=restricted.for_grpc(settings.grpc_restricted_protocols),
        response_compression=settings.grpc_infer_response_compression,
    )
    server.bind(settings.grpc_address, settings.grpc_port, tls.from_settings(settings))
    return server
