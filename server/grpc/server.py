"""The grpc.aio server: the inference service and ``grpc.health.v1.Health`` on one port, in the
same event loop as HTTP."""

from __future__ import annotations

from typing import Any

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from server.dataplane import DataPlane
from server.generated import grpc_service_pb2 as pb
from server.grpc.servicer import RAW_METHODS, InferenceServicer
from server.memory.host_pool import HostBufferPool

#: Triton's limit for both directions; grpcio's default 4 MiB receive limit breaks big tensors.
MAX_MESSAGE_SIZE = 2**31 - 1
SERVICE_NAME = "inference.GRPCInferenceService"


def _service_handler(servicer: InferenceServicer) -> grpc.GenericRpcHandler:
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
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


class GrpcServer:
    """Owns the grpc.aio server and keeps the health service in step with readiness."""

    def __init__(self, dataplane: DataPlane, pool: HostBufferPool | None = None) -> None:
        self._dataplane = dataplane
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE_SIZE),
                ("grpc.max_receive_message_length", MAX_MESSAGE_SIZE),
                # grpcio shares ports by default: a second server would silently split traffic.
                ("grpc.so_reuseport", 0),
            ]
        )
        self._server.add_generic_rpc_handlers((_service_handler(InferenceServicer(dataplane, pool)),))
        self._health = health.aio.HealthServicer()
        self.port = 0
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._server)

    def bind(self, address: str, port: int) -> int:
        """Listen on ``address:port`` (0 picks a free port); the bound port."""
        try:
            bound = self._server.add_insecure_port(f"{address}:{port}")
        except RuntimeError as exc:  # grpcio's "Failed to bind"
            raise OSError(f"unable to bind the gRPC service to {address}:{port}: {exc}") from exc
        if bound == 0:
            raise OSError(f"unable to bind the gRPC service to {address}:{port}")
        self.port = bound
        return bound

    async def start(self) -> None:
        await self._server.start()
        await self.update_health()

    async def update_health(self) -> None:
        """SERVING while the server is ready, NOT_SERVING otherwise ("" = the whole server)."""
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if self._dataplane.ready()
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for service in ("", SERVICE_NAME):
            await self._health.set(service, status)

    async def stop(self, grace_secs: float) -> None:
        await self._health.enter_graceful_shutdown()
        await self._server.stop(grace_secs)
