"""The one interface the transports call: ``DataPlane`` in one process, ``ExecutorClient``
in a front end (which asks the executor). Control calls are coroutines so that a front end can
answer them with the executor's truth; ``live`` and ``gate`` are the answering process's own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from typing import Any, Protocol

from server.generated import grpc_service_pb2 as pb
from server.generated import model_config_pb2 as mc
from server.protocol.model_spec import ModelSpec
from server.protocol.streaming import StreamReply
from server.protocol.types import InferRequest, InferResponse
from server.request_gate import RequestGate


class Plane(Protocol):
    """What HTTP and gRPC need from the server behind them."""

    gate: RequestGate
    #: ``infer`` hands each request to another process (a front end's plane, the executor's
    #: client) rather than running it here.
    remote: bool

    def live(self) -> bool: ...

    async def ready(self) -> bool: ...

    async def server_metadata(self) -> dict[str, Any]: ...

    async def model_ready(self, name: str, version: str) -> bool: ...

    async def model_metadata(self, name: str, version: str) -> dict[str, Any]: ...

    async def model_spec(self, name: str, version: str) -> ModelSpec: ...

    async def model_config(self, name: str, version: str) -> mc.ModelConfig: ...

    async def infer(self, request: InferRequest) -> InferResponse: ...

    def requests_held(self) -> AbstractContextManager[None]:
        """Requests started inside go to the models together at its end (a transport wraps
        what it parses of one read in it, so that requests that arrived together are batched
        together); in one process each starts at once, as there is nothing to send."""
        ...

    def infer_stream(self, request: InferRequest) -> AsyncIterator[StreamReply]:
        """Every reply to ``request`` (a decoupled model's many), the last flagged final."""
        ...

    async def repository_index(self, ready_only: bool) -> list[dict[str, Any]]: ...

    async def load_model(
        self, name: str, config_json: str | None, files: dict[str, bytes]
    ) -> None: ...

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None: ...

    async def statistics(self, name: str, version: str) -> pb.ModelStatisticsResponse: ...

    async def shm_status(self, kind: str, name: str) -> list[dict[str, Any]]: ...

    async def shm_register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        ...

    async def shm_register_cuda(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None: ...

    async def shm_unregister(self, kind: str, name: str) -> None: ...

    async def log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Apply checked log setting changes (none: just read) everywhere; all settings."""
        ...

    async def trace_settings(
        self, model_name: str, changes: dict[str, Any] | None
    ) -> dict[str, Any]:
        """Apply checked trace setting changes (None: just read) to the global settings
        ("") or a model's; all its settings."""
        ...
