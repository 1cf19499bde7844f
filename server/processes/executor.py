"""The executor process: ``python -m server.processes.executor <tensorgate flags>``, started by
the supervisor. It owns the repository, backends, CUDA, schedulers and batchers, the shared
memory registries, statistics and ``/metrics``, and serves the front ends over the control
socket (``server.ipc.service``). It never parses HTTP or gRPC requests from clients."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence

from server import heap
from server.app import (
    build_repository,
    connect_models,
    load_models,
    poll_repository,
    start_metrics,
)
from server.cuda.host_register import register_with_cuda, unregister_from_cuda
from server.dataplane import DataPlane
from server.event_loop import run
from server.ipc.service import ExecutorService
from server.memory.host_pool import HostBufferPool
from server.processes import child
from server.processes.child import ChildInfo
from server.processes.sizes import output_arena_bytes
from server.settings import Settings
from server.shutdown import Shutdown

log = logging.getLogger("server")


async def serve(settings: Settings, info: ChildInfo) -> int:
    shutdown = Shutdown(settings.exit_timeout_secs)
    shutdown.install((signal.SIGTERM,))
    pool = HostBufferPool(pinned_limit=settings.pinned_memory_pool_byte_size)
    repository = build_repository(settings, pool)
    failed = await load_models(settings, shutdown, repository)
    if failed is not None:
        return failed
    dataplane = DataPlane(settings, repository, pool)
    service = ExecutorService(dataplane, output_arena_bytes(settings, info.frontends))
    service.on_connected = register_with_cuda
    service.on_released = unregister_from_cuda
    connect_models(service.model_calls())
    try:
        metrics = start_metrics(settings, dataplane, pool) if settings.allow_metrics else None
    except OSError as exc:
        log.error("error: %s", exc)
        await repository.close()
        return 1
    assert info.control_fd is not None
    listener = socket.socket(fileno=info.control_fd)
    serving = asyncio.create_task(service.serve(listener))
    poller = (
        asyncio.create_task(
            poll_repository(repository, settings.repository_poll_secs, service.invalidate)
        )
        if settings.model_control_mode == "poll"
        else None
    )
    dataplane.set_live(True)
    heap.settle(heap.EXECUTOR_YOUNG_THRESHOLD)
    child.report_ready(info)

    await shutdown.requested.wait()

    # The supervisor stops the front ends first: what is left here has no client any more,
    # so nothing is waited for.
    serving.cancel()
    if poller is not None:
        poller.cancel()
    if metrics is not None:
        metrics.stop()
    service.close()
    listener.close()
    dataplane.set_live(False)
    try:
        await asyncio.wait_for(repository.close(0), shutdown.remaining())
    except TimeoutError:
        log.warning("models still busy at exit")
    dataplane.close()
    log.info("executor stopped")
    return 0


def main(argv: Sequence[str]) -> int:
    info, settings = child.begin(child.EXECUTOR, argv)
    code = run(serve(settings, info))
    # Model threads whose requests were cut at the stop may still run, and Python would wait
    # for them at exit: nothing here needs finalizing, so the process leaves now.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
