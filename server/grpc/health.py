"""``grpc.health.v1.Health`` (Check and Watch), kept in step with the server's readiness by
``server.grpc.server``, with the messages of ``grpcio-health-checking``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from grpc_health.v1 import health_pb2

from server.grpc.call import CallContext
from server.grpc.status import StatusCode

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICE_UNKNOWN = health_pb2.HealthCheckResponse.SERVICE_UNKNOWN


class HealthService:
    """The status of each service name ("" for the whole server); after
    ``enter_graceful_shutdown`` every one is NOT_SERVING for good."""

    def __init__(self) -> None:
        self._status: dict[str, int] = {}
        self._changed = asyncio.Event()
        self._shutting_down = False

    def set(self, service: str, status: int) -> None:
        if self._shutting_down or self._status.get(service) == status:
            return
        self._status[service] = status
        self._changed.set()
        self._changed = asyncio.Event()

    def enter_graceful_shutdown(self) -> None:
        for service in self._status:
            self.set(service, NOT_SERVING)
        self._shutting_down = True

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: CallContext
    ) -> health_pb2.HealthCheckResponse:
        status = self._status.get(request.service)
        if status is None:
            await context.abort(StatusCode.NOT_FOUND, "unknown service")
        return health_pb2.HealthCheckResponse(status=status)

    async def Watch(
        self, request: health_pb2.HealthCheckRequest, context: CallContext
    ) -> AsyncIterator[health_pb2.HealthCheckResponse]:
        """The service's status now, then each change, until the client goes."""
        last = None
        while True:
            changed = self._changed
            status = self._status.get(request.service, SERVICE_UNKNOWN)
            if status != last:
                last = status
                yield health_pb2.HealthCheckResponse(status=status)
            await changed.wait()
