"""``--grpc-restricted-protocol`` on the gRPC port: a call of a restricted category whose
metadata lacks the expected ``triton-grpc-protocol-<key>`` value is refused with UNAVAILABLE
before its request is read (a stream ends before its first request), as Triton's handlers do.
Checked only when some category is restricted."""

from __future__ import annotations

from collections.abc import Callable

from server import restricted
from server.errors import InferenceServerError
from server.grpc.call import Method
from server.grpc.headers import RequestHead

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

Refusal = Callable[[Method, RequestHead], InferenceServerError | None]


def refusal(restrictions: restricted.Restrictions) -> Refusal | None:
    """What refuses the calls ``restrictions`` restrict (None: nothing is restricted)."""
    if not restrictions:
        return None

    def check(method: Method, head: RequestHead) -> InferenceServerError | None:
        metadata = head.metadata

        def value(name: str) -> str | None:  # gRPC sends metadata keys in lower case
            key = name.lower()
            for item, text in metadata:
                if item == key and isinstance(text, str):
                    return text
            return None

        return restrictions.refusal(method.category, value)

    return check
