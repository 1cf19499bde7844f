"""The executor's side of the seam: serves every front end's connection from one DataPlane.

Each connection brings the front end's arena (mapped here to view request tensors in place)
and gets an output arena of its own. Blocks of it are lent to each request's run, so that a
model may write large outputs there itself (``LentBlocks``); other large results are copied
there once. Both arenas are unmapped when the connection has ended and its last request has
finished. Requests run as tasks, so a ``Cancel`` stops one that is still queued (it counts as
CANCELED, as in one process). Model loads and unloads, and log setting changes, are reported
to every front end, and acknowledged by each, before the call that made them returns; a front
end that connects gets the log settings as they are.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from typing import Any

from server import eager, logs
from server.dataplane import DataPlane
from server.errors import InferenceServerError, InternalError
from server.ipc import messages as m
from server.ipc.channel import Channel, receive_hello, send_hello
from server.ipc.tensors import LentBlocks, Outbox, pack, shm_ref, unpack
from server.memory.arena import Arena, ArenaAllocator
from server.protocol.types import (
    SHARED_MEMORY_PENDING,
    InferRequest,
    InferResponse,
    InputTensor,
    RequestedOutput,
)
from server.threads import OFF_LOOP_BYTES, off_loop_if_large
from server.tracing.context import TraceContext

log = logging.getLogger("server.ipc")

_HANDSHAKE_TIMEOUT_S = 10.0
_ACK_TIMEOUT_S = 5.0
#: Control calls a front end may make, and how each result travels.
_CALLS = {
    "ready": None,
    "server_metadata": None,
    "model_ready": None,
    "model_metadata": None,
    "model_config": "serialize",
    "repository_index": None,
    "load_model": "changes",
    "unload_model": "changes",
    "statistics": "serialize",
    "shm_status": None,
    "shm_register_system": None,
    "shm_register_cuda": None,
    "shm_unregister": None,
    "log_settings": "logging",
    "trace_settings": None,
}


class _Connection:
    """One front end: its channel, its arena, our output arena, its running requests."""

    def __init__(self, index: int, peer: Arena, out: Arena) -> None:
        self.index = index
        self.peer = peer
        self.out = out
        self.allocator = ArenaAllocator(out.size)
        self.outbox = Outbox(out.array, self.allocator.allocate)
        self.tasks: dict[int, asyncio.Task[None]] = {}
        #: traced requests answered, waiting for their ``Sent``
        self.traced: dict[int, Callable[[int, int], None]] = {}
        self.channel: Channel[m.ToExecutor] | None = None
        self.lost = False

    def send(self, message: Any) -> None:
        if self.channel is not None:
            self.channel.send(message)

    def close_when_idle(self, release: Callable[[Arena], object] | None) -> None:
        if self.lost and not self.tasks and not self.peer.closed:
            for arena in (self.peer, self.out):
                if release is not None:
                    release(arena)
                arena.close()


class ExecutorService:
    def __init__(self, dataplane: DataPlane, output_arena_bytes: int) -> None:
        """Made on the loop that serves the front ends (kept: see ``eager``)."""
        self._loop = asyncio.get_running_loop()
        self._dataplane = dataplane
        self._output_bytes = output_arena_bytes
        self._connections: set[_Connection] = set()
        self._acks: dict[int, asyncio.Future[None]] = {}
        self._next_ack = 0
        self._calls: set[asyncio.Task[None]] = set()
        #: called with each arena of a front end as it connects, its request arena and the
        #: result arena made for it (the executor pins them for CUDA: a GPU's copies from and
        #: into them are then DMA), and once that front end is gone and its last request done
        #: (unpinned before unmapped)
        self.on_connected: Callable[[Arena], object] | None = None
        self.on_released: Callable[[Arena], object] | None = None

    async def serve(self, listener: socket.socket) -> None:
        """Accept front ends on ``listener`` until cancelled."""
        listener.setblocking(False)
        while True:
            sock, _ = await self._loop.sock_accept(listener)
            task = self._loop.create_task(self._welcome(sock))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)

    async def _welcome(self, sock: socket.socket) -> None:
        sock.setblocking(True)
        sock.settimeout(_HANDSHAKE_TIMEOUT_S)
        fd: int | None = None
        peer: Arena | None = None
        out: Arena | None = None
        try:
            body, received = await asyncio.to_thread(receive_hello, sock)
            fd = received
            hello = m.decode_hello(body)
            # Mapping pre-faults every page, pinning is a driver call: neither on the loop,
            # which serves the other front ends meanwhile.
            attached = await asyncio.to_thread(
                Arena.attach, received, hello.arena_bytes, writable=True
            )
            fd, peer = None, attached  # the arena owns the fd now
            if self.on_connected is not None:
                await asyncio.to_thread(self.on_connected, attached)
            out = await asyncio.to_thread(Arena.create, self._output_bytes)
            if self.on_connected is not None:
                await asyncio.to_thread(self.on_connected, out)
            reply = m.encoder().encode(m.Hello("executor", 0, out.size))
            await asyncio.to_thread(send_hello, sock, reply, out.fd)
        except (OSError, ConnectionError, m.DecodeError, ValueError) as exc:
            log.error("a front end failed to connect: %s", exc)
            sock.close()
            if fd is not None:
                os.close(fd)
            for arena in (peer, out):
                if arena is not None:
                    if self.on_released is not None:
                        self.on_released(arena)
                    arena.close()
            return
        connection = _Connection(hello.index, attached, out)
        connection.channel = Channel(
            m.to_executor_decoder(),
            lambda message: self._on_message(connection, message),
            lambda: self._on_lost(connection),
            gather=True,
        )
        self._connections.add(connection)  # a model change from now on reaches it
        try:
            await connection.channel.attach(sock)
        except OSError as exc:
            log.error("front end %d failed to connect: %s", hello.index, exc)
            sock.close()
            self._on_lost(connection)
            return
        connection.send(m.LogSettings(0, logs.current()))  # a restarted one's may be stale
        log.debug("front end %d connected", hello.index)

    def _on_lost(self, connection: _Connection) -> None:
        """The front end is gone: nobody will read its answers; stop its requests."""
        log.debug("front end %d disconnected", connection.index)
        self._connections.discard(connection)
        connection.lost = True
        connection.channel = None
        for task in connection.tasks.values():
            task.cancel()
        traced, connection.traced = connection.traced, {}
        for finish in traced.values():
            finish(0, 0)
        connection.close_when_idle(self.on_released)

    def _on_message(self, connection: _Connection, message: m.ToExecutor) -> None:
        if isinstance(message, m.Infer):
            # Most small requests are answered within this step: no task for them.
            task = eager.start(self._infer(connection, message), self._loop)
            if task is not None:
                connection.tasks[message.id] = task
                task.add_done_callback(lambda done: self._finished(connection, message.id, done))
        elif isinstance(message, m.Cancel):
            running = connection.tasks.get(message.id)
            if running is not None:
                # After the step already scheduled: a request that has not started yet first
                # reaches its queue, so it is counted as CANCELED there, as in one process.
                self._loop.call_soon(running.cancel)
        elif isinstance(message, m.Release):
            for offset in message.offsets:
                try:
                    connection.allocator.free(offset)
                except ValueError:
                    log.error("front end %d released unknown block %d", connection.index, offset)
        elif isinstance(message, m.Call):
            task = self._loop.create_task(self._call(connection, message))
            self._calls.add(task)
            task.add_done_callback(self._calls.discard)
        elif isinstance(message, m.Sent):
            finish = connection.traced.pop(message.id, None)
            if finish is not None:
                finish(message.start, message.end)
        elif isinstance(message, m.Acknowledge):
            waiting = self._acks.pop(message.id, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(None)

    async def _infer(self, connection: _Connection, message: m.Infer) -> None:
        lent = LentBlocks(connection.outbox, connection.allocator.free)
        try:
            request = self._request(connection, message)
            if message.stream:
                await self._stream(connection, message, request, lent)
                return
            response = await self._dataplane.infer(request, lent)
            connection.send(await self._done(connection, message, response, lent))
        except InferenceServerError as exc:
            connection.send(m.Failed(message.id, type(exc).__name__, exc.message))
        except Exception as exc:
            log.exception("request %d of front end %d failed", message.id, connection.index)
            connection.send(m.Failed(message.id, "InternalError", f"internal error: {exc}"))
        finally:
            lent.reclaim()

    async def _done(
        self,
        connection: _Connection,
        message: m.Infer,
        response: InferResponse,
        lent: LentBlocks,
    ) -> m.Done:
        owned: list[int] = []
        outbox = connection.outbox
        try:
            # A large result's copy into the arena is off the loop, which serves every
            # front end (the thread is waited for, also when cancelled); outputs the model
            # wrote into lent blocks are not copied.
            copies = response.payload_bytes
            if copies > OFF_LOOP_BYTES:
                copies = outbox.copy_bytes(
                    [None if o.shared_memory else o.data for o in response.outputs]
                )
            outputs = await off_loop_if_large(copies, _pack_outputs, response, outbox, owned)
            lent.hand_over(outputs)
        except BaseException:
            for offset in owned:
                connection.allocator.free(offset)
            raise
        traced = response.on_sent is not None
        if response.on_sent is not None:  # ended by the front end's Sent
            if connection.lost:
                response.on_sent(0, 0)
            else:
                connection.traced[message.id] = response.on_sent
            response.on_sent = None
        return m.Done(message.id, response.model_name, response.model_version, response.id,
                      response.parameters, outputs, traced)

    async def _stream(
        self, connection: _Connection, message: m.Infer, request: InferRequest, lent: LentBlocks
    ) -> None:
        """Each reply of ``infer_stream`` as a ``Streamed`` message, in order."""
        async for reply in self._dataplane.infer_stream(request, lent):
            done = None
            if reply.response is not None:
                done = await self._done(connection, message, reply.response, lent)
            error = reply.error
            connection.send(
                m.Streamed(message.id, reply.final, reply.model_version, done,
                           None if error is None else type(error).__name__,
                           "" if error is None else error.message)
            )
            if reply.final:
                return

    def _finished(self, connection: _Connection, request: int, task: asyncio.Task[None]) -> None:
        """Every request gets a final answer, also one cancelled before it ever ran."""
        connection.tasks.pop(request, None)
        if task.cancelled():
            connection.send(m.Failed(request, "Unavailable", "the request was cancelled"))
        connection.close_when_idle(self.on_released)

    def _request(self, connection: _Connection, message: m.Infer) -> InferRequest:
        inputs = []
        peer = connection.peer.array
        for tensor in message.inputs:
            datatype, shape, data = unpack(tensor, peer, message.model)
            if data is None:
                inputs.append(
                    InputTensor(
                        tensor.name, datatype, shape, SHARED_MEMORY_PENDING, tensor.parameters,
                        shm_ref(tensor.shm),
                    )
                )
            else:
                inputs.append(InputTensor(tensor.name, datatype, shape, data, tensor.parameters))
        outputs = None
        if message.outputs is not None:
            outputs = [
                RequestedOutput(o.name, o.parameters, shm_ref(o.shm)) for o in message.outputs
            ]
        trace = None if message.trace is None else TraceContext(*message.trace)
        return InferRequest(
            message.model, message.version, inputs, outputs, message.request_id,
            message.parameters, trace,
        )

    async def _call(self, connection: _Connection, message: m.Call) -> None:
        if message.method == "in_flight":  # the service's own: requests of every front end
            connection.send(m.Returned(message.id, sum(len(c.tasks) for c in self._connections)))
            return
        kind = _CALLS.get(message.method, "unknown")
        try:
            if kind == "unknown":
                raise InternalError(f"unknown executor call '{message.method}'")
            method = getattr(self._dataplane, message.method)
            try:
                value = await method(*message.args)
            finally:
                if kind == "changes":
                    await self.invalidate()
            if kind == "logging":
                await self._broadcast(lambda ack: m.LogSettings(ack, value))
            if kind == "serialize":
                value = value.SerializeToString()
            connection.send(m.Returned(message.id, value))
        except InferenceServerError as exc:
            connection.send(m.Failed(message.id, type(exc).__name__, exc.message))
        except Exception as exc:
            log.exception("executor call %s failed", message.method)
            connection.send(m.Failed(message.id, "InternalError", f"internal error: {exc}"))

    async def invalidate(self, wait: bool = True) -> None:
        """Tell every front end that models changed; with ``wait``, return once each has
        dropped its cached specs (or stopped answering for ``_ACK_TIMEOUT_S``)."""
        await self._broadcast(m.Invalidate, wait)

    async def _broadcast(self, message: Callable[[int], Any], wait: bool = True) -> None:
        """Send ``message(ack id)`` to every front end; with ``wait``, return once each has
        acknowledged it (or stopped answering for ``_ACK_TIMEOUT_S``)."""
        waiting: dict[int, asyncio.Future[None]] = {}
        for connection in list(self._connections):
            self._next_ack += 1
            waiting[self._next_ack] = self._loop.create_future()
            connection.send(message(self._next_ack))
        if not wait:
            return
        self._acks.update(waiting)
        try:
            if waiting:
                await asyncio.wait(waiting.values(), timeout=_ACK_TIMEOUT_S)
        finally:
            for ack in waiting:
                self._acks.pop(ack, None)

    def model_calls(self) -> _ModelCalls:
        """The data plane as python models call it: their loads and unloads are reported to
        every front end, as a client's are."""
        return _ModelCalls(self._dataplane, self.invalidate)

    def close(self) -> None:
        for connection in list(self._connections):
            if connection.channel is not None:
                connection.channel.close()
        for task in list(self._calls):
            task.cancel()


class _ModelCalls:
    """``DataPlane`` for BLS and model control (``backends.python.server_link.ServerCalls``)."""

    def __init__(self, dataplane: DataPlane, invalidate: Callable[[], Awaitable[None]]) -> None:
        self._dataplane = dataplane
        self._invalidate = invalidate
        self.infer = dataplane.infer
        self.infer_stream = dataplane.infer_stream
        self.model_ready = dataplane.model_ready
        self.model_spec = dataplane.model_spec

    async def load_model(self, name: str, config_json: str | None, files: dict[str, bytes]) -> None:
        try:
            await self._dataplane.load_model(name, config_json, files)
        finally:
            await self._invalidate()

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        try:
            await self._dataplane.unload_model(name, unload_dependents)
        finally:
            await self._invalidate()


def _pack_outputs(response: InferResponse, outbox: Outbox, owned: list[int]) -> list[m.Tensor]:
    return [
        pack(o.name, o.datatype, o.shape, None if o.shared_memory else o.data, {},
             o.shared_memory, outbox, owned)
        for o in response.outputs
    ]
