"""The front end's data plane: every call is answered by the executor.

Inference requests go out as descriptors (``tensors``), and come back as views of the
executor's output arena, released once the transport has written the response
(``InferResponse.release``). Control calls are forwarded; the only state kept here is a cache
of model specs (for decoding), dropped whenever the executor says models changed, before that
change is reported to any client. When the executor goes away every pending request fails
with UNAVAILABLE at once and the front end stops being ready.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

import numpy as np

from server import errors, logs
from server.errors import InferenceServerError, InternalError, Unavailable
from server.generated import grpc_service_pb2 as pb
from server.generated import model_config_pb2 as mc
from server.ipc import messages as m
from server.ipc.channel import Channel, receive_hello, send_hello, wait_readable
from server.ipc.tensors import Outbox, pack, shm_ref, shm_tuple, unpack
from server.memory.arena import Arena
from server.protocol.model_spec import ModelSpec
from server.protocol.streaming import StreamReply
from server.protocol.types import InferRequest, InferResponse, OutputTensor
from server.request_gate import RequestGate
from server.threads import off_loop_if_large

log = logging.getLogger("server.ipc")

EXECUTOR_GONE = "the server's executor process has stopped"


def error_from(name: str, message: str) -> InferenceServerError:
    """The error the executor raised, as the same class here (its texts unchanged)."""
    kind = getattr(errors, name, None)
    if isinstance(kind, type) and issubclass(kind, InferenceServerError):
        return kind(message)
    return InternalError(message)


class ExecutorClient:
    """``server.plane.Plane`` for a front end."""

    def __init__(self, outbox: Outbox, free: Callable[[int], None]) -> None:
        """``outbox`` is this front end's arena; ``free(offset)`` returns one of its blocks."""
        self.gate = RequestGate()
        self.remote = True  # (``Plane.remote``)
        self._outbox = outbox
        self._free = free
        self._channel: Channel[m.ToFrontEnd] | None = None
        self._peer_arena: Arena | None = None  # the executor's output arena, mapped here
        self._peer = np.empty(0, dtype=np.uint8)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        #: streamed requests' replies, in order, until the final one (or a ``Failed``)
        self._streams: dict[int, asyncio.Queue[m.Streamed | m.Failed]] = {}
        self._ids = itertools.count(1)
        self._specs: dict[tuple[str, str], ModelSpec] = {}
        self._connected = False

    async def connect(self, path: str, index: int, arena_fd: int, arena_bytes: int) -> None:
        """Introduce this front end (and its arena) to the executor at ``path``, map the
        executor's output arena, and start reading. The executor takes the connection once
        its models are loaded (front ends start beside it): until then this waits on the loop,
        where a stop can cancel it, as it could not cancel a thread blocked in ``recv``."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, path)
            hello = m.encoder().encode(m.Hello("frontend", index, arena_bytes))
            send_hello(sock, hello, arena_fd)  # a few bytes into an empty buffer
            await wait_readable(sock)
            body, fd = receive_hello(sock)
            reply = m.decode_hello(body)
            # Mapping it pre-faults every page: not on the loop. A failure or a stop from
            # here on ends the front end: its exit closes the fd, also while a thread still
            # maps it (closing it here could pull it from under that thread).
            self._peer_arena = await asyncio.to_thread(
                Arena.attach, fd, reply.arena_bytes, writable=False
            )
            self._peer = self._peer_arena.array
            self._channel = Channel(m.to_front_end_decoder(), self._on_message, self._on_lost)
            await self._channel.attach(sock)
        except BaseException:
            sock.close()
            raise
        self._connected = True

    def close(self) -> None:
        self._connected = False  # our own doing: not worth an error line
        if self._channel is not None:
            self._channel.close()

    # --- the channel ----------------------------------------------------------------------

    def _on_message(self, message: m.ToFrontEnd) -> None:
        if type(message) is m.Done:  # most messages: a request's answer
            done = self._pending.pop(message.id, None)
            if done is None or done.done():  # its request was given up: free its outputs
                self._given_up(message)
            else:
                done.set_result(message)
            return
        if isinstance(message, m.Invalidate):
            self._specs.clear()
            assert self._channel is not None
            self._channel.send(m.Acknowledge(message.id))
            return
        if isinstance(message, m.LogSettings):
            logs.update(message.settings)
            assert self._channel is not None
            self._channel.send(m.Acknowledge(message.id))
            return
        if isinstance(message, m.Streamed | m.Failed) and message.id in self._streams:
            self._streams[message.id].put_nowait(message)
            return
        if isinstance(message, m.Streamed):  # its stream was given up: free its outputs
            if message.done is not None:
                self._given_up(message.done)
            return
        future = self._pending.pop(message.id, None)  # a control call's reply, or a Failed
        if future is not None and not future.done():
            future.set_result(message)

    def _on_lost(self) -> None:
        if self._connected:
            log.error("%s: failing %d pending requests", EXECUTOR_GONE, len(self._pending))
        self._connected = False
        self._specs.clear()
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(Unavailable(EXECUTOR_GONE))
        for call_id, replies in self._streams.items():
            replies.put_nowait(m.Failed(call_id, "Unavailable", EXECUTOR_GONE))

    def _send(self, message: Any, call_id: int) -> asyncio.Future[Any]:
        """Send ``message``; the future of its answer."""
        if not self._connected or self._channel is None:
            raise Unavailable(EXECUTOR_GONE)
        future: asyncio.Future[Any] = self._channel.loop.create_future()
        self._pending[call_id] = future
        self._channel.send(message)
        return future

    async def _call(self, method: str, *args: Any) -> Any:
        call_id = next(self._ids)
        reply = await self._send(m.Call(call_id, method, list(args)), call_id)
        if isinstance(reply, m.Failed):
            raise error_from(reply.error, reply.message)
        return reply.value

    def _release_outputs(self, done: m.Done) -> None:
        offsets = _arena_offsets(done)
        if offsets and self._channel is not None:
            self._channel.send(m.Release(offsets))

    def _given_up(self, done: m.Done) -> None:
        """An answer nobody will send: its outputs are freed, its trace ends unsent."""
        self._release_outputs(done)
        if done.traced:
            self._sent(done.id, 0, 0)

    def _sent(self, call_id: int, start: int, end: int) -> None:
        if self._channel is not None:
            self._channel.send(m.Sent(call_id, start, end))

    async def in_flight_anywhere(self) -> int:
        """Requests the executor is running for any front end (0 once it is gone)."""
        try:
            count: int = await self._call("in_flight")
        except Unavailable:
            return 0
        return count

    # --- Plane ----------------------------------------------------------------------------

    def live(self) -> bool:
        return self._connected

    async def ready(self) -> bool:
        if not self._connected or self.gate.closed:
            return False
        return bool(await self._call("ready"))

    async def server_metadata(self) -> dict[str, Any]:
        value: dict[str, Any] = await self._call("server_metadata")
        return value

    async def model_ready(self, name: str, version: str) -> bool:
        return bool(await self._call("model_ready", name, version))

    async def model_metadata(self, name: str, version: str) -> dict[str, Any]:
        value: dict[str, Any] = await self._call("model_metadata", name, version)
        return value

    async def model_spec(self, name: str, version: str) -> ModelSpec:
        key = (name, version)
        spec = self._specs.get(key)
        if spec is None:
            config = mc.ModelConfig.FromString(await self._call("model_config", name, version))
            spec = ModelSpec.from_config(config)
            if self._connected:
                self._specs[key] = spec
        return spec

    async def model_config(self, name: str, version: str) -> mc.ModelConfig:
        return mc.ModelConfig.FromString(await self._call("model_config", name, version))

    async def repository_index(self, ready_only: bool) -> list[dict[str, Any]]:
        value: list[dict[str, Any]] = await self._call("repository_index", ready_only)
        return value

    async def load_model(self, name: str, config_json: str | None, files: dict[str, bytes]) -> None:
        await self._call("load_model", name, config_json, files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        await self._call("unload_model", name, unload_dependents)

    async def statistics(self, name: str, version: str) -> pb.ModelStatisticsResponse:
        return pb.ModelStatisticsResponse.FromString(await self._call("statistics", name, version))

    async def shm_status(self, kind: str, name: str) -> list[dict[str, Any]]:
        value: list[dict[str, Any]] = await self._call("shm_status", kind, name)
        return value

    async def shm_register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        await self._call("shm_register_system", name, key, offset, byte_size)

    async def shm_register_cuda(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        await self._call("shm_register_cuda", name, raw_handle, device_id, byte_size)

    async def log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("log_settings", changes)
        return result

    async def trace_settings(
        self, model_name: str, changes: dict[str, Any] | None
    ) -> dict[str, Any]:
        result: dict[str, Any] = await self._call("trace_settings", model_name, changes)
        return result

    async def shm_unregister(self, kind: str, name: str) -> None:
        await self._call("shm_unregister", kind, name)

    @contextlib.contextmanager
    def requests_held(self) -> Iterator[None]:
        """Requests started inside reach the executor together, in one write, at its end."""
        channel = self._channel
        if channel is None:
            yield
            return
        channel.hold()
        try:
            yield
        finally:
            channel.release()

    async def infer(self, request: InferRequest) -> InferResponse:
        """Run ``request`` in the executor. Blocks this sends copies into the arena are freed
        on the executor's final answer, never before (it may be reading them), also when the
        client goes away meanwhile (then the executor is told to drop the request)."""
        owned: list[int] = []
        try:
            # Copying a large tensor into the arena (a gRPC message's bytes) is off the loop.
            copies = self._outbox.copy_bytes([t.data for t in request.inputs])
            message = await off_loop_if_large(copies, self._describe, request, owned)
            answer = self._send(message, message.id)
            try:
                # A caller cancelled here cancels the future (no shield per request):
                # ``_abandon`` waits for the final answer in its place.
                reply = await answer
            except asyncio.CancelledError:
                await self._abandon(message.id, answer)
                raise
        finally:
            for offset in owned:
                self._free(offset)
        if isinstance(reply, m.Failed):
            raise error_from(reply.error, reply.message)
        return self._response(reply)

    async def _abandon(self, call_id: int, answer: asyncio.Future[Any]) -> None:
        """Tell the executor to drop request ``call_id`` and wait for its final answer, also
        through further cancellations: until it comes the executor may be reading the
        request's blocks (and the HTTP body the caller holds), which must not be reused
        before. It comes soon (a dropped request is answered at once), or the executor is
        gone and ``_on_lost`` fails the future."""
        if answer.done() and not answer.cancelled():
            # Answered, but the caller was cancelled before it resumed: nobody reads it.
            if answer.exception() is None and isinstance(answer.result(), m.Done):
                self._given_up(answer.result())
            return
        if call_id not in self._pending or self._channel is None:
            return
        future = self._pending[call_id] = self._channel.loop.create_future()
        self._channel.send(m.Cancel(call_id))
        while not future.done():
            try:
                await asyncio.shield(future)
            except asyncio.CancelledError:
                continue
            except InferenceServerError:
                return
        if not future.cancelled() and future.exception() is None:
            reply = future.result()
            if isinstance(reply, m.Done):
                self._given_up(reply)

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[StreamReply]:
        """``infer`` answered by a stream of replies (``Streamed``). The arena blocks of the
        inputs are freed once the executor has sent its last reply; a stream given up before
        that tells the executor to drop it, and ends only once it has (as ``infer``: the
        caller may then reuse the inputs' buffers, a pooled gRPC message)."""
        owned: list[int] = []
        call_id: int | None = None
        ended = False
        try:
            copies = self._outbox.copy_bytes([t.data for t in request.inputs])
            message = await off_loop_if_large(copies, self._describe, request, owned, True)
            if not self._connected or self._channel is None:
                raise Unavailable(EXECUTOR_GONE)
            call_id = message.id
            replies: asyncio.Queue[m.Streamed | m.Failed] = asyncio.Queue()
            self._streams[call_id] = replies
            self._channel.send(message)
            while not ended:
                item = await replies.get()
                if isinstance(item, m.Failed):
                    ended = True
                    raise error_from(item.error, item.message)
                ended = item.final
                yield self._stream_reply(item)
        finally:
            if ended or call_id is None:
                self._end_stream(call_id, owned)
            else:
                await self._abandon_stream(call_id, owned)

    def _stream_reply(self, item: m.Streamed) -> StreamReply:
        error = None if item.error is None else error_from(item.error, item.message)
        response = None if item.done is None else self._response(item.done)
        return StreamReply(response, error, item.final, item.model_version)

    def _end_stream(self, call_id: int | None, owned: list[int]) -> None:
        if call_id is not None:
            self._streams.pop(call_id, None)
        for offset in owned:
            self._free(offset)

    async def _abandon_stream(self, call_id: int, owned: list[int]) -> None:
        """Drop stream ``call_id``: tell the executor, and wait, also through further
        cancellations, for its last reply (its outputs released); then free the inputs'
        blocks. It comes soon (a dropped request is answered at once), or the executor is
        gone and ``_on_lost`` ends the stream."""
        replies = self._streams.get(call_id)
        if replies is None or self._channel is None or not self._connected:
            self._end_stream(call_id, owned)
            return
        self._channel.send(m.Cancel(call_id))
        try:
            while True:
                try:
                    item = await replies.get()  # (a cancelled get leaves the item queued)
                except asyncio.CancelledError:
                    continue
                if isinstance(item, m.Failed):
                    return
                if item.done is not None:
                    self._given_up(item.done)
                if item.final:
                    return
        finally:
            self._end_stream(call_id, owned)

    def _describe(
        self, request: InferRequest, owned: list[int], stream: bool = False
    ) -> m.Infer:
        inputs = [
            pack(t.name, t.datatype, t.shape, t.data, t.parameters, t.shared_memory,
                 self._outbox, owned)
            for t in request.inputs
        ]
        outputs = None
        if request.outputs is not None:
            outputs = [
                m.Wanted(o.name, o.parameters, shm_tuple(o.shared_memory))
                for o in request.outputs
            ]
        trace = None if request.trace is None else request.trace.as_tuple()
        return m.Infer(
            next(self._ids), request.model_name, request.model_version, request.id,
            request.parameters, inputs, outputs, stream, trace,
        )

    def _response(self, done: m.Done) -> InferResponse:
        outputs = []
        for tensor in done.outputs:
            datatype, shape, data = unpack(tensor, self._peer, done.model_name)
            if data is None:  # written into a shared memory region: no data in the response
                data = np.empty(0, dtype=datatype.dtype)
            outputs.append(OutputTensor(tensor.name, datatype, shape, data, shm_ref(tensor.shm)))
        response = InferResponse(
            done.model_name, done.model_version, outputs, done.response_id, done.parameters
        )
        if _arena_offsets(done):
            response.on_release = lambda: self._release_outputs(done)
        if done.traced:
            response.on_sent = lambda start, end: self._sent(done.id, start, end)
            response.sent_from = time.perf_counter_ns()
        return response


def _arena_offsets(done: m.Done) -> list[int]:
    """The blocks of the executor's arena that ``done``'s outputs are in."""
    return [t.offset for t in done.outputs if t.offset >= 0 and t.inline is None]
