"""The grpc.aio server: the inference service and ``grpc.health.v1.Health`` on one port, in the
same event loop as HTTP."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2

from server.generated import grpc_service_pb2 as pb
from server.grpc.restriction import RestrictionInterceptor
from server.grpc.servicer import RAW_METHODS, InferenceServicer
from server.memory.host_pool import HostBufferPool
from server.plane import Plane
from server.restricted import Restrictions
from server.settings import GrpcKeepalive
from server.tls import TlsFiles

#: Triton's limit for both directions; grpcio's default 4 MiB receive limit breaks big tensors.
MAX_MESSAGE_SIZE = 2**31 - 1
SERVICE_NAME = "inference.GRPCInferenceService"
HEALTH_SERVICE = "grpc.health.v1.Health"
#: The methods the core matches itself; the rest go through one generic handler (see below).
REGISTERED_METHODS = ("ModelInfer",)
#: Streams one connection may have at once (Triton sets no limit; grpc core's default is
#: unlimited). grpc core counts a stream until the server has freed it, not only until the
#: client reset it ("grpc.http.overload_protection", set below), so a client opening and
#: resetting streams faster than they are freed (HTTP/2 rapid reset, CVE-2023-44487) has its
#: new streams refused (RST_STREAM REFUSED_STREAM) past this many instead of flooding the
#: server's queue of calls, where other connections' calls were cancelled. grpc clients wait
#: for a free stream instead of opening more.
MAX_CONCURRENT_STREAMS = 1000
#: grpc core channel arguments (names from grpc's channel_arg_names.h and chttp2's internal.h).
SERVER_OPTIONS = (
    ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
    ("grpc.max_receive_message_length", MAX_MESSAGE_SIZE),
    ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
    ("grpc.http.overload_protection", 1),
)


def keepalive_options(keepalive: GrpcKeepalive) -> list[tuple[str, int]]:
    """The channel arguments of tritonserver's keepalive flags. With the defaults, a client's
    pings sooner than 5 minutes after the previous one, while no data is sent, are strikes;
    past 2 of them the connection is closed (GOAWAY ENHANCE_YOUR_CALM "too_many_pings")."""
    options = [
        ("grpc.keepalive_time_ms", keepalive.time_ms),
        ("grpc.keepalive_timeout_ms", keepalive.timeout_ms),
        ("grpc.keepalive_permit_without_calls", int(keepalive.permit_without_calls)),
        ("grpc.http2.max_pings_without_data", keepalive.max_pings_without_data),
        ("grpc.http2.min_ping_interval_without_data_ms",
         keepalive.min_recv_ping_interval_without_data_ms),
        ("grpc.http2.max_ping_strikes", keepalive.max_ping_strikes),
    ]
    if keepalive.max_connection_age_ms is not None:
        options.append(("grpc.max_connection_age_ms", keepalive.max_connection_age_ms))
    if keepalive.max_connection_age_grace_ms is not None:
        options.append(("grpc.max_connection_age_grace_ms", keepalive.max_connection_age_grace_ms))
    return options


def _method_handlers(servicer: InferenceServicer) -> dict[str, grpc.RpcMethodHandler[Any, Any]]:
    """Handlers for every RPC of the service, read from its descriptor. ``RAW_METHODS`` get
    serialized bytes in and out; the others protobuf messages."""
    service = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        behaviour = getattr(servicer, method.name)
        if method.name in RAW_METHODS:
            deserialize, serialize = None, None
        else:
            request_class = message_factory.GetMessageClass(method.input_type)
            deserialize, serialize = request_class.FromString, _serialize
        make = (
            grpc.stream_stream_rpc_method_handler
            if method.client_streaming
            else grpc.unary_unary_rpc_method_handler
        )
        handlers[method.name] = make(
            behaviour, request_deserializer=deserialize, response_serializer=serialize
        )
    return handlers


def _health_handler(servicer: health.aio.HealthServicer) -> grpc.GenericRpcHandler:
    """The health service as a generic handler (``add_HealthServicer_to_server`` would also
    register its two methods: two more pending calls waited on per call, see above)."""
    return grpc.method_handlers_generic_handler(
        HEALTH_SERVICE,
        {
            "Check": grpc.unary_unary_rpc_method_handler(
                servicer.Check,
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=_serialize,
            ),
            "Watch": grpc.unary_stream_rpc_method_handler(
                servicer.Watch,
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=_serialize,
            ),
        },
    )


def _credentials(tls: TlsFiles) -> grpc.ServerCredentials:
    """TLS with the server's certificate; with ``mutual``, clients must present a certificate
    the root certificates verify."""
    return grpc.ssl_server_credentials(
        [(tls.server_key, tls.server_cert)],
        root_certificates=tls.root_cert,
        require_client_auth=tls.mutual,
    )


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


class GrpcServer:
    """Owns the grpc.aio server and keeps the health service in step with readiness."""

    def __init__(
        self,
        dataplane: Plane,
        pool: HostBufferPool | None = None,
        share_port: bool = False,
        keepalive: GrpcKeepalive | None = None,
        restrictions: Restrictions | None = None,
    ) -> None:
        """``share_port``: several front ends listen on one port (SO_REUSEPORT);
        ``restrictions``: ``--grpc-restricted-protocol``'s (an interceptor checks every call
        when one is set; none costs nothing)."""
        self._dataplane = dataplane
        # grpcio shares ports by default: a second server would silently split traffic. Only
        # the front ends of one server share theirs (the supervisor has made sure it is ours).
        options = [
            *SERVER_OPTIONS,
            *keepalive_options(keepalive or GrpcKeepalive()),
            ("grpc.so_reuseport", int(share_port)),
        ]
        interceptors = [RestrictionInterceptor(restrictions)] if restrictions else []
        self._server = grpc.aio.server(options=options, interceptors=interceptors)
        # ModelInfer is a registered method: the core matches its calls itself, without a
        # generic handler's lookup in Python per call. Only it: for every call it takes,
        # grpc.aio's server loop waits (asyncio.wait) on one pending call per registered method
        # plus one generic, and with all 20 of the service's and health's 2 registered that
        # wait was a third of a front end's profiled time per ModelInfer.
        handlers = _method_handlers(InferenceServicer(dataplane, pool))
        registered = {name: handlers.pop(name) for name in REGISTERED_METHODS}
        self._server.add_registered_method_handlers(SERVICE_NAME, registered)
        self._health = health.aio.HealthServicer()
        self._server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),
                _health_handler(self._health),
            )
        )
        self.port = 0

    def bind(self, address: str, port: int, tls: TlsFiles | None = None) -> int:
        """Listen on ``address:port`` (0 picks a free port), with TLS when ``tls`` is given;
        the bound port."""
        target = f"{address}:{port}"
        try:
            if tls is None:
                bound = self._server.add_insecure_port(target)
            else:
                bound = self._server.add_secure_port(target, _credentials(tls))
        except RuntimeError as exc:  # grpcio's "Failed to bind"
            raise OSError(f"unable to bind the gRPC service to {target}: {exc}") from exc
        if bound == 0:
            raise OSError(f"unable to bind the gRPC service to {target}")
        self.port = bound
        return bound

    async def start(self) -> None:
        await self._server.start()
        await self.update_health()

    async def update_health(self) -> None:
        """SERVING while the server is ready, NOT_SERVING otherwise ("" = the whole server)."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if await self._dataplane.ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE_NAME):
            await self._health.set(service, status)

    async def stop(self, grace_secs: float) -> None:
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_secs)
