"""A front-end process: ``python -m server.processes.frontend <tensorgate flags>``, started by
the supervisor. HTTP (on the listening socket the supervisor bound) and gRPC (on the shared
port), the codecs and validation, request bodies received into this process's arena, and the
client of the executor behind the transports' data plane. It never loads a model, never
imports ONNX Runtime or CuPy, never maps a client's shared memory region."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import signal
import socket
import sys
from collections.abc import Sequence

from server import heap, restricted, tls
from server.event_loop import run
from server.grpc.server import GrpcServer
from server.http.endpoint import start_http
from server.ipc.client import ExecutorClient
from server.ipc.tensors import Outbox
from server.memory.arena import Arena, ArenaPool
from server.processes import child
from server.processes.child import ChildInfo
from server.processes.sizes import request_arena_bytes
from server.settings import Settings
from server.shutdown import GRACE_SECS, Shutdown

log = logging.getLogger("server")

_CLOSE_TIMEOUT_SECS = 5
_DRAIN_POLL_SECS = 0.05


async def serve(settings: Settings, info: ChildInfo) -> int:
    shutdown = Shutdown(settings.exit_timeout_secs)
    shutdown.install((signal.SIGTERM,))
    arena = await asyncio.to_thread(Arena.create, request_arena_bytes(settings, info.frontends))
    pool = ArenaPool(arena)
    client = ExecutorClient(Outbox(arena.array, pool.allocator.allocate), pool.allocator.free)
    # Started beside the executor: this waits until it has loaded its models.
    log.debug("front end %d waiting for the executor", info.index)
    if not await shutdown.unless_stopped(
        client.connect(info.control_path, info.index, arena.fd, arena.size)
    ):
        log.info("front end %d stopped before the executor was ready", info.index)
        return 0
    grpc_server = None
    if info.grpc_fd is not None:
        grpc_server = GrpcServer(
            client,
            keepalive=settings.grpc_keepalive,
            buffers=pool,
            restrictions=restricted.for_grpc(settings.grpc_restricted_protocols),
            response_compression=settings.grpc_infer_response_compression,
        )
        grpc_server.bind(
            settings.grpc_address, 0, tls.from_settings(settings),
            sockets=[socket.socket(fileno=info.grpc_fd)],
        )
    http_server = None
    if info.http_fd is not None:
        http_server = start_http(settings, client, pool, [socket.socket(fileno=info.http_fd)])
    if grpc_server is not None:
        await grpc_server.start()
    heap.settle()
    child.report_ready(info)

    await shutdown.requested.wait()

    log.info(
        "front end %d stopping: finishing %d in-flight requests (at most %d s)",
        info.index, client.gate.inside, settings.exit_timeout_secs,
    )
    client.gate.close()  # new requests get 503 / UNAVAILABLE; readiness turns false
    if http_server is not None:
        http_server.listener.close()
    if grpc_server is not None:
        await grpc_server.update_health()
    finished = await _drain(client, shutdown)
    if not finished:
        log.warning(
            "front end %d: exiting without waiting for the requests still running (%d)",
            info.index, client.gate.inside,
        )
    if grpc_server is not None:
        await grpc_server.stop(grace_secs=0)
    if http_server is not None:
        try:
            await asyncio.wait_for(
                http_server.server.close_all_connections(),
                min(_CLOSE_TIMEOUT_SECS, shutdown.remaining()),
            )
        except TimeoutError:
            log.warning("HTTP connections did not close in time")
    client.close()
    return 0


async def _drain(client: ExecutorClient, shutdown: Shutdown) -> bool:
    """Until this front end's requests and every other front end's are done (or the exit
    timeout): meanwhile its open connections are answered (503, not ready), as one process
    does while any request is in flight; whether everything finished."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + max(0.0, shutdown.remaining() - GRACE_SECS)
    while client.gate.inside or await client.in_flight_anywhere():
        if loop.time() >= deadline:
            return False
        await asyncio.sleep(_DRAIN_POLL_SECS)
    return True


def main(argv: Sequence[str]) -> int:
    info, settings = child.begin(child.FRONTEND, argv)
    # The bodies in flight are bounded per process: each front end holds its share.
    share = max(1, settings.http_max_inflight_bytes // max(1, info.frontends))
    return run(serve(dataclasses.replace(settings, http_max_inflight_bytes=share), info))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
