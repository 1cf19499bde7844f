"""``inference.GRPCInferenceService``: translate, call the data plane, translate.

Errors come from the shared hierarchy and map to gRPC codes through ``server.errors``; no RPC
chooses a code itself.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

from server import log_settings
from server.errors import InvalidArgument, Unsupported, reported
from server.generated import grpc_service_pb2 as pb
from server.grpc.call import (
    OWN_BYTES,
    CallContext,
    Message,
    Payload,
    StreamMessage,
    Views,
    discard,
    payload_size,
)
from server.grpc.sequence_order import SequenceOrder
from server.grpc.status import status_code
from server.grpc.stream_window import StreamWindow
from server.memory.host_pool import HostBuffer, HostBufferPool, PooledBuffer
from server.plane import Plane
from server.protocol import grpc_codec
from server.protocol.header_cache import HeaderCache, decode_grpc
from server.protocol.model_spec import ModelSpec
from server.protocol.streaming import EMPTY_FINAL_PARAMETER
from server.protocol.types import InferRequest, InferResponse
from server.repository.overrides import FILE_PREFIX
from server.threads import off_loop_if_large
from server.tracing import api as trace_api
from server.tracing.context import TraceContext

log = logging.getLogger("server.grpc")

Request = TypeVar("Request")
Response = TypeVar("Response")
Context = CallContext
Handler = Callable[[Any, Request, Context], Awaitable[Response]]


def _unary(handler: Handler[Request, Response]) -> Handler[Request, Response]:
    """Answer a failing unary RPC with its error's code and message."""

    @functools.wraps(handler)
    async def wrapped(self: Any, request: Request, context: Context) -> Response:
        try:
            return await handler(self, request, context)
        except Exception as exc:
            error = reported(exc, log, f"in {handler.__name__}")
            await context.abort(status_code(error), error.message)
            raise  # abort() raises; this line is never reached

    return wrapped


def _decode(
    headers: HeaderCache,
    request: pb.ModelInferRequest,
    spec: ModelSpec,
    raw: list[memoryview] | None,
    pinned: HostBuffer | None,
) -> InferRequest:
    """``grpc_codec.decode_request``, after copying the raw inputs into ``pinned`` (once); a
    header seen before is not decoded again (``HeaderCache``)."""
    if pinned is not None and raw is not None:
        views = []
        offset = 0
        for part in raw:
            end = offset + len(part)
            pinned.view[offset:end] = part
            views.append(pinned.view[offset:end])
            offset = end
        raw = views
    return decode_grpc(headers, request, spec, raw)


def _release(buffer: PooledBuffer, _: object) -> None:
    buffer.release()


def _traceparent(context: Context) -> str:
    """The call's W3C ``traceparent`` metadata ("" without one)."""
    for key, value in context.invocation_metadata() or ():
        if key == "traceparent":
            return value if isinstance(value, str) else value.decode("latin-1")
    return ""


#: A reply whose outputs lie in the executor's arena is sent from there when its tensors take
#: at least this many bytes (joining smaller ones into one write costs less than the parts).
VIEWED_REPLY_BYTES = 1 << 16

#: Triton's answer to a unary inference request for a decoupled model (UNSUPPORTED).
MODEL_INFER_DECOUPLED = "ModelInfer RPC doesn't support models with decoupled transaction policy"


def _error_reply(request: pb.ModelInferRequest, message: str) -> bytes:
    """A stream's ``error_message`` reply for ``request`` (the stream goes on)."""
    return pb.ModelStreamInferResponse(
        error_message=message,
        infer_response=pb.ModelInferResponse(
            model_name=request.model_name,
            model_version=request.model_version,
            id=request.id,
        ),
    ).SerializeToString()


def _empty_final(request: pb.ModelInferRequest, spec: ModelSpec, version: str) -> bytes:
    """The flags-only final response a client asked for with
    ``triton_enable_empty_final_response``: no outputs, ``triton_final_response`` true."""
    response = pb.ModelInferResponse(
        model_name=spec.name, model_version=version or request.model_version, id=request.id
    )
    response.parameters[grpc_codec.FINAL_RESPONSE].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=response).SerializeToString()


def _shm_status(kind: str, response_type: Any) -> Handler[Any, Any]:
    """The status RPC of one kind of shared memory (``response_type`` is its response)."""

    @_unary
    async def handler(self: InferenceServicer, request: Any, context: Context) -> Any:
        response = response_type()
        for entry in await self._dataplane.shm_status(kind, request.name):
            response.regions[entry["name"]].CopyFrom(response_type.RegionStatus(**entry))
        return response

    handler.__name__ = f"{kind.capitalize()}SharedMemoryStatus"
    return handler


def _shm_unregister(kind: str, response_type: Any) -> Handler[Any, Any]:
    """The unregister RPC of one kind of shared memory: one region, or all (no name)."""

    @_unary
    async def handler(self: InferenceServicer, request: Any, context: Context) -> Any:
        await self._dataplane.shm_unregister(kind, request.name)
        return response_type()

    handler.__name__ = f"{kind.capitalize()}SharedMemoryUnregister"
    return handler


#: Methods whose handlers take and return serialized messages (``grpc_codec`` reads and
#: writes their tensor fields without protobuf's copies); the others take messages.
RAW_METHODS = frozenset({"ModelInfer", "ModelStreamInfer"})


class InferenceServicer:
    """The V2 gRPC service, backed by the same data plane as HTTP. One coroutine per RPC of
    ``inference.GRPCInferenceService``, registered by ``server.grpc.server``."""

    def __init__(self, dataplane: Plane, pool: HostBufferPool | None = None) -> None:
        """``pool`` supplies pinned buffers for the raw inputs when the server has a GPU."""
        self._dataplane = dataplane
        self._pool = pool
        self._headers = HeaderCache()

    @_unary
    async def ServerLive(
        self, request: pb.ServerLiveRequest, context: Context
    ) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=self._dataplane.live())

    @_unary
    async def ServerReady(
        self, request: pb.ServerReadyRequest, context: Context
    ) -> pb.ServerReadyResponse:
        return pb.ServerReadyResponse(ready=await self._dataplane.ready())

    @_unary
    async def ModelReady(
        self, request: pb.ModelReadyRequest, context: Context
    ) -> pb.ModelReadyResponse:
        return pb.ModelReadyResponse(
            ready=await self._dataplane.model_ready(request.name, request.version)
        )

    @_unary
    async def ServerMetadata(
        self, request: pb.ServerMetadataRequest, context: Context
    ) -> pb.ServerMetadataResponse:
        return pb.ServerMetadataResponse(**await self._dataplane.server_metadata())

    @_unary
    async def ModelMetadata(
        self, request: pb.ModelMetadataRequest, context: Context
    ) -> pb.ModelMetadataResponse:
        meta = await self._dataplane.model_metadata(request.name, request.version)
        tensor = pb.ModelMetadataResponse.TensorMetadata
        return pb.ModelMetadataResponse(
            name=meta["name"],
            versions=meta["versions"],
            platform=meta["platform"],
            inputs=[tensor(**t) for t in meta["inputs"]],
            outputs=[tensor(**t) for t in meta["outputs"]],
        )

    @_unary
    async def ModelConfig(
        self, request: pb.ModelConfigRequest, context: Context
    ) -> pb.ModelConfigResponse:
        return pb.ModelConfigResponse(
            config=await self._dataplane.model_config(request.name, request.version)
        )

    @_unary
    async def ModelInfer(self, request: bytes | memoryview, context: Context) -> Payload:
        """Serialized in and out (see ``RAW_METHODS``): tensor bytes are not copied twice. A
        large request arrives as a view of the pool's buffer the transport received it in
        (``context.request_buffer``): pinned with a GPU, or the front end's arena."""
        received = time.perf_counter_ns()
        # (With a GPU the raw inputs are copied into pinned memory, small ones too, unless
        # they were received there.)
        buffer = context.request_buffer
        pinned = buffer is not None and buffer.pinned
        message, raw = grpc_codec.split_request(request, not self._pins() or pinned)
        trace = TraceContext("GRPC", received, time.perf_counter_ns(), _traceparent(context))
        return await self._infer(message, raw, len(request), trace, pinned)

    async def _infer(
        self,
        request: pb.ModelInferRequest,
        raw: list[memoryview] | None,
        size: int,
        trace: TraceContext,
        received_pinned: bool = False,
    ) -> Payload:
        """The serialized ``ModelInferResponse``: ``_replies`` without an async generator,
        which unary calls (most of them) need not pay for."""
        with self._dataplane.gate.admit():
            _, decoded, pinned = await self._prepare(
                request, raw, size, False, trace, received_pinned
            )
            try:
                response = await self._dataplane.infer(decoded)
                return await self._encoded(response, False, True)
            finally:
                if pinned is not None:
                    pinned.release()

    async def _replies(
        self,
        request: pb.ModelInferRequest,
        raw: list[memoryview] | None,
        size: int,
        stream: bool,
        trace: TraceContext | None = None,
        received_pinned: bool = False,
    ) -> AsyncGenerator[Payload, None]:
        """The serialized replies: one ``ModelInferResponse``, or with ``stream`` each
        ``ModelStreamInferResponse`` (a decoupled model's many; an error among them as an
        ``error_message`` reply)."""
        with self._dataplane.gate.admit():
            spec, decoded, pinned = await self._prepare(
                request, raw, size, stream, trace, received_pinned
            )
            try:
                if spec is None or not spec.decoupled:
                    response = await self._dataplane.infer(decoded)
                    yield await self._encoded(response, stream, True)
                    return
                empty_final = decoded.parameters.get(EMPTY_FINAL_PARAMETER) is True
                async for reply in self._dataplane.infer_stream(decoded):
                    if reply.error is not None:
                        yield _error_reply(request, reply.error.message)
                    elif reply.response is not None:
                        yield await self._encoded(reply.response, stream, reply.final)
                    elif reply.final and empty_final:
                        yield _empty_final(request, spec, reply.model_version)
            finally:
                if pinned is not None:
                    pinned.release()

    async def _prepare(
        self,
        request: pb.ModelInferRequest,
        raw: list[memoryview] | None,
        size: int,
        stream: bool,
        trace: TraceContext | None,
        received_pinned: bool = False,
    ) -> tuple[ModelSpec | None, InferRequest, HostBuffer | None]:
        """The model's spec, the decoded request, and the pinned buffer its raw inputs were
        copied into (the caller releases it; none when they were received pinned)."""
        # Resolve the model first: an unknown model is reported as such whatever the body.
        spec = await self._dataplane.model_spec(request.model_name, request.model_version)
        if spec is not None and spec.decoupled and not stream:  # (test doubles may have none)
            raise Unsupported(MODEL_INFER_DECOUPLED)
        pinned = None if received_pinned else self._pinned_buffer(raw)
        try:
            # The copy into pinned memory, typed contents and BYTES elements (converted one
            # by one) are work of the size of the message: off the loop when large.
            decoded = await off_loop_if_large(
                size, _decode, self._headers, request, spec, raw, pinned
            )
        except BaseException:
            if pinned is not None:
                pinned.release()
            raise
        decoded.trace = trace
        return spec, decoded, pinned

    async def _encoded(self, response: InferResponse, stream: bool, final: bool) -> Payload:
        """The serialized reply. Outputs in the executor's arena (``on_release``: they stay
        there until released) are written from there: a large reply is ``Views`` of them,
        released once sent. Otherwise the reply is new bytes: outputs that may view the
        inputs are copied now, before the buffers they view are released."""
        size = response.payload_bytes
        if response.on_release is not None and size >= VIEWED_REPLY_BYTES:
            try:
                parts = grpc_codec.encode_response_parts(response, stream, final)
            except BaseException:
                response.release()
                raise
            return Views(parts, response.release)
        try:
            return await off_loop_if_large(
                size, grpc_codec.encode_response_bytes, response, stream, final
            )
        finally:
            response.release()

    def _pins(self) -> bool:
        return self._pool is not None and self._pool.pins

    def _pinned_buffer(self, raw: list[memoryview] | None) -> HostBuffer | None:
        """With a GPU, a pinned buffer for the raw inputs, from which the executor's
        host-to-device copies are DMA; None (protobuf's own bytes are used) otherwise, or once
        the pinned budget is spent (a copy would gain nothing)."""
        if self._pool is None or not self._pins() or not raw:
            return None
        buffer = self._pool.acquire(sum(len(part) for part in raw))
        if not buffer.pinned:
            buffer.release()
            return None
        return buffer

    async def ModelStreamInfer(
        self,
        request_iterator: AsyncIterator[StreamMessage],
        context: Context,
    ) -> AsyncIterator[Payload]:
        """Requests run concurrently (those of one sequence one after the other, see
        ``SequenceOrder``); each reply goes out when ready (maybe out of order) and carries
        its request's id. A failed request is an ``error_message`` reply: the stream
        stays open. While the client leaves replies unread, the stream stops reading requests
        (``StreamWindow``). A large request comes in the pooled buffer the transport received
        it in (as ModelInfer's); it goes back once its request has its last reply, and the
        data plane no longer reads it."""
        replies: asyncio.Queue[Payload | None] = asyncio.Queue()
        running: set[asyncio.Task[None]] = set()
        window = StreamWindow()
        order = SequenceOrder()

        traceparent = _traceparent(context)

        async def answer(data: Message, pinned: bool) -> None:
            request = pb.ModelInferRequest()
            try:
                received = time.perf_counter_ns()
                request, raw = grpc_codec.split_request(data, not self._pins() or pinned)
                trace = TraceContext("GRPC", received, time.perf_counter_ns(), traceparent)
                async with order.turn(request).wait():
                    async for reply in self._replies(request, raw, len(data), True, trace, pinned):
                        window.replied(payload_size(reply))
                        replies.put_nowait(reply)
            except Exception as exc:  # noqa: BLE001 - an error_message reply; the stream goes on
                error = reported(exc, log, "in ModelStreamInfer")
                reply = _error_reply(request, error.message)
                window.replied(len(reply))
                replies.put_nowait(reply)
            window.answered(len(data), 0)

        async def read() -> None:
            try:
                async for message in request_iterator:
                    if isinstance(message, OWN_BYTES):
                        data, buffer = message, None
                    else:
                        data, buffer = message.view, message
                    window.read(len(data))
                    task = asyncio.create_task(answer(data, buffer is not None and buffer.pinned))
                    running.add(task)
                    task.add_done_callback(running.discard)
                    if buffer is not None:  # also a task cancelled before it ever ran
                        task.add_done_callback(functools.partial(_release, buffer))
                    await window.room()
                while running:
                    await asyncio.wait(list(running))
            finally:
                replies.put_nowait(None)  # ends the replies even when reading failed

        reader = asyncio.create_task(read())
        try:
            while (reply := await replies.get()) is not None:
                size = payload_size(reply)
                yield reply  # resumes once flow control has taken the reply
                window.sent(size)
            await reader  # surfaces a failure to read the request stream
        finally:
            reader.cancel()
            for task in list(running):
                task.cancel()
            while not replies.empty():  # (those of tasks still running are dropped as they come)
                unsent = replies.get_nowait()
                if unsent is not None:
                    discard(unsent)

    @_unary
    async def ModelStatistics(
        self, request: pb.ModelStatisticsRequest, context: Context
    ) -> pb.ModelStatisticsResponse:
        return await self._dataplane.statistics(request.name, request.version)

    @_unary
    async def RepositoryIndex(
        self, request: pb.RepositoryIndexRequest, context: Context
    ) -> pb.RepositoryIndexResponse:
        entries = await self._dataplane.repository_index(request.ready)
        return pb.RepositoryIndexResponse(
            models=[pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in entries]
        )

    @_unary
    async def RepositoryModelLoad(
        self, request: pb.RepositoryModelLoadRequest, context: Context
    ) -> pb.RepositoryModelLoadResponse:
        config: str | None = None
        files: dict[str, bytes] = {}
        for key, param in request.parameters.items():
            kind = param.WhichOneof("parameter_choice")
            if key == "config":
                if kind != "string_param":
                    raise InvalidArgument("Unable to parse 'config': expected a string parameter")
                config = param.string_param
            elif key.startswith(FILE_PREFIX):
                if kind != "bytes_param":
                    raise InvalidArgument(
                        f"Unable to parse '{key[:200]}': expected a bytes parameter"
                    )
                files[key] = param.bytes_param
        await self._dataplane.load_model(request.model_name, config, files)
        return pb.RepositoryModelLoadResponse()

    @_unary
    async def RepositoryModelUnload(
        self, request: pb.RepositoryModelUnloadRequest, context: Context
    ) -> pb.RepositoryModelUnloadResponse:
        dependents = False
        if "unload_dependents" in request.parameters:
            param = request.parameters["unload_dependents"]
            if param.WhichOneof("parameter_choice") != "bool_param":
                raise InvalidArgument("Unable to parse 'unload_dependents': expected a boolean")
            dependents = param.bool_param
        await self._dataplane.unload_model(request.model_name, dependents)
        return pb.RepositoryModelUnloadResponse()
    SystemSharedMemoryStatus = _shm_status("system", pb.SystemSharedMemoryStatusResponse)
    SystemSharedMemoryUnregister = _shm_unregister(
        "system", pb.SystemSharedMemoryUnregisterResponse
    )
    CudaSharedMemoryStatus = _shm_status("cuda", pb.CudaSharedMemoryStatusResponse)
    CudaSharedMemoryUnregister = _shm_unregister("cuda", pb.CudaSharedMemoryUnregisterResponse)

    @_unary
    async def SystemSharedMemoryRegister(
        self, request: pb.SystemSharedMemoryRegisterRequest, context: Context
    ) -> pb.SystemSharedMemoryRegisterResponse:
        await self._dataplane.shm_register_system(
            request.name, request.key, request.offset, request.byte_size
        )
        return pb.SystemSharedMemoryRegisterResponse()

    @_unary
    async def CudaSharedMemoryRegister(
        self, request: pb.CudaSharedMemoryRegisterRequest, context: Context
    ) -> pb.CudaSharedMemoryRegisterResponse:
        await self._dataplane.shm_register_cuda(
            request.name,
            request.raw_handle,
            request.device_id,
            request.byte_size,
        )
        return pb.CudaSharedMemoryRegisterResponse()

    @_unary
    async def TraceSetting(
        self, request: pb.TraceSettingRequest, context: Context
    ) -> pb.TraceSettingResponse:
        if request.model_name and request.settings:  # an unknown model first (as Triton)
            await self._dataplane.trace_settings(request.model_name, None)
        changes = trace_api.from_grpc(request.settings) if request.settings else None
        current = await self._dataplane.trace_settings(request.model_name, changes)
        return trace_api.to_grpc(current)

    @_unary
    async def LogSettings(
        self, request: pb.LogSettingsRequest, context: Context
    ) -> pb.LogSettingsResponse:
        changes = log_settings.from_grpc(request.settings)
        return log_settings.to_grpc(await self._dataplane.log_settings(changes))
