"""``--grpc-restricted-protocol`` on the gRPC port: an interceptor that refuses an RPC of a
restricted category whose metadata lacks the expected ``triton-grpc-protocol-<key>`` value,
with UNAVAILABLE before its request is read (a stream ends before its first request), as
Triton's handlers do. Installed only when some category is restricted."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import grpc

from server import restricted
from server.errors import InferenceServerError
from server.grpc.servicer import Context, status_code

_SERVICE = "/inference.GRPCInferenceService/"

#: Full method name -> category, as Triton registers its handlers (``src/grpc/grpc_server.cc``,
#: ``infer_handler.cc``, ``stream_infer_handler.cc``); the health service's Check is in
#: "health" there, and Watch, which Triton lacks, goes with it.
METHOD_CATEGORIES = {
    **{
        _SERVICE + name: category
        for name, category in (
            ("ServerLive", restricted.HEALTH),
            ("ServerReady", restricted.HEALTH),
            ("ModelReady", restricted.HEALTH),
            ("ServerMetadata", restricted.METADATA),
            ("ModelMetadata", restricted.METADATA),
            ("ModelInfer", restricted.INFERENCE),
            ("ModelStreamInfer", restricted.INFERENCE),
            ("ModelConfig", restricted.MODEL_CONFIG),
            ("ModelStatistics", restricted.STATISTICS),
            ("RepositoryIndex", restricted.MODEL_REPOSITORY),
            ("RepositoryModelLoad", restricted.MODEL_REPOSITORY),
            ("RepositoryModelUnload", restricted.MODEL_REPOSITORY),
            ("SystemSharedMemoryStatus", restricted.SHARED_MEMORY),
            ("SystemSharedMemoryRegister", restricted.SHARED_MEMORY),
            ("SystemSharedMemoryUnregister", restricted.SHARED_MEMORY),
            ("CudaSharedMemoryStatus", restricted.SHARED_MEMORY),
            ("CudaSharedMemoryRegister", restricted.SHARED_MEMORY),
            ("CudaSharedMemoryUnregister", restricted.SHARED_MEMORY),
            ("TraceSetting", restricted.TRACE),
            ("LogSettings", restricted.LOGGING),
        )
    },
    "/grpc.health.v1.Health/Check": restricted.HEALTH,
    "/grpc.health.v1.Health/Watch": restricted.HEALTH,
}

Metadata = Sequence[tuple[str, str | bytes]]


def _lookup(metadata: Metadata) -> Callable[[str], str | None]:
    """A header lookup over one call's metadata (whose keys gRPC sends in lower case)."""

    def value(name: str) -> str | None:
        key = name.lower()
        for item, text in metadata:
            if item == key and isinstance(text, str):
                return text
        return None

    return value


class RestrictionInterceptor(grpc.aio.ServerInterceptor):
    """Swaps the handler of a refused call for one answering its error."""

    def __init__(self, restrictions: restricted.Restrictions) -> None:
        self._restrictions = restrictions

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = await continuation(handler_call_details)
        if handler is None:  # an unknown method: grpc answers UNIMPLEMENTED
            return handler
        metadata: Metadata = handler_call_details.invocation_metadata or ()
        refusal = self._restrictions.refusal(
            METHOD_CATEGORIES.get(handler_call_details.method), _lookup(metadata)
        )
        return handler if refusal is None else _refusing(handler, refusal)


def _refusing(
    handler: grpc.RpcMethodHandler[Any, Any], error: InferenceServerError
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of ``handler``'s kind that answers ``error``, parsing no request."""

    async def refuse(request: Any, context: Context) -> None:
        await context.abort(status_code(error), error.message)

    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse)
    return grpc.unary_unary_rpc_method_handler(refuse)
