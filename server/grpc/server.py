"""The gRPC server: ``inference.GRPCInferenceService`` and ``grpc.health.v1.Health`` on one port,
served by ``server.grpc.connection`` on the same event loop as HTTP, in plain TCP or TLS."""

from __future__ import annotations

import asyncio
import socket
import ssl

from google.protobuf import message_factory
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2
from tornado.netutil import bind_sockets

from server.generated import grpc_service_pb2 as pb
from server.grpc import restriction
from server.grpc.call import Method
from server.grpc.connection import GrpcService
from server.grpc.health import NOT_SERVING, SERVING, HealthService
from server.grpc.servicer import RAW_METHODS, InferenceServicer
from server.listener import Listener
from server.memory.host_pool import BufferSource, HostBufferPool
from server.plane import Plane
from server.restricted import Restrictions
from server.settings import GrpcKeepalive
from server.tls import TlsFiles

#: Triton's limit for both directions (grpcio's default 4 MiB receive limit broke big tensors).
MAX_MESSAGE_SIZE = 2**31 - 1
SERVICE_NAME = "inference.GRPCInferenceService"
HEALTH_SERVICE = "grpc.health.v1.Health"


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


#: The methods whose responses ``--grpc-infer-response-compression-level`` compresses.
INFER_METHODS = frozenset({"ModelInfer", "ModelStreamInfer"})


def methods(
    servicer: InferenceServicer, health: HealthService, compression: str = "none"
) -> dict[str, Method]:
    """Every RPC of the inference service (read from its descriptor) and of health, by path.
    ``RAW_METHODS`` take and give serialized bytes; the others protobuf messages. The infer
    methods' responses are compressed at level ``compression``, as tritonserver's are."""
    table: dict[str, Method] = {}
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    for method in service.methods:
        path = f"/{SERVICE_NAME}/{method.name}"
        raw = method.name in RAW_METHODS
        request_class = message_factory.GetMessageClass(method.input_type)
        table[path] = Method(
            getattr(servicer, method.name),
            request_streaming=method.client_streaming,
            response_streaming=method.server_streaming,
            deserialize=None if raw else request_class.FromString,
            serialize=None if raw else _serialize,
            category=restriction.METHOD_CATEGORIES.get(path),
            compression=compression if method.name in INFER_METHODS else "none",
        )
    for name, streaming in (("Check", False), ("Watch", True)):
        path = f"/{HEALTH_SERVICE}/{name}"
        table[path] = Method(
            getattr(health, name),
            response_streaming=streaming,
            deserialize=health_pb2.HealthCheckRequest.FromString,
            serialize=_serialize,
            category=restriction.METHOD_CATEGORIES.get(path),
        )
    return table


class GrpcServer:
    """Owns the gRPC port's service and listener, and keeps the health service in step with
    readiness."""

    def __init__(
        self,
        dataplane: Plane,
        pool: HostBufferPool | None = None,
        keepalive: GrpcKeepalive | None = None,
        restrictions: Restrictions | None = None,
        buffers: BufferSource | None = None,
        response_compression: str = "none",
    ) -> None:
        """``pool``: pinned buffers for raw inputs (one process with a GPU); ``buffers``:
        where large requests are received (``GrpcService``); ``restrictions``:
        ``--grpc-restricted-protocol``'s (checked per call when some category is restricted;
        none costs nothing); ``response_compression``:
        ``--grpc-infer-response-compression-level``."""
        self._dataplane = dataplane
        self._health = HealthService()
        self._service = GrpcService(
            methods(InferenceServicer(dataplane, pool), self._health, response_compression),
            keepalive or GrpcKeepalive(),
            restriction.refusal(restrictions) if restrictions else None,
            MAX_MESSAGE_SIZE,
            buffers,
            dataplane.requests_held,
        )
        self._sockets: list[socket.socket] = []
        self._ssl: ssl.SSLContext | None = None
        self._listener: Listener | None = None
        self.port = 0

    def bind(
        self, address: str, port: int, tls: TlsFiles | None = None,
        sockets: list[socket.socket] | None = None,
    ) -> int:
        """Listen on ``address:port`` (0 picks a free port), or on ``sockets`` already
        listening (a front end's, which the supervisor bound), with TLS when ``tls`` is
        given; the bound port."""
        if tls is not None:
            try:
                self._ssl = tls.server_context(["h2"])
            except (ssl.SSLError, OSError) as exc:
                raise OSError(f"unable to use the gRPC TLS files: {exc}") from exc
        try:
            self._sockets = sockets or bind_sockets(port, address)
        except OSError as exc:
            raise OSError(f"unable to bind the gRPC service to {address}:{port}: {exc}") from exc
        self.port = int(self._sockets[0].getsockname()[1])
        return self.port

    async def start(self) -> None:
        self._service.ssl = self._ssl
        self._listener = Listener(self._service, self._sockets, "GRPCInferenceService")
        await self.update_health()

    async def update_health(self) -> None:
        """SERVING while the server is ready, NOT_SERVING otherwise ("" = the whole server)."""
        status = SERVING if await self._dataplane.ready() else NOT_SERVING
        for service in ("", SERVICE_NAME):
            self._health.set(service, status)

    async def stop(self, grace_secs: float) -> None:
        """Stop accepting; let open calls finish for ``grace_secs``; then cancel the rest and
        close every connection."""
        self._health.enter_graceful_shutdown()
        if self._listener is not None:
            self._listener.close()
        else:
            for sock in self._sockets:
                sock.close()
        connections = list(self._service.connections)
        for connection in connections:
            connection.go_away()
        if connections and grace_secs > 0:
            await asyncio.wait([c.closed for c in connections], timeout=grace_secs)
        for connection in list(self._service.connections):
            connection.abort()
