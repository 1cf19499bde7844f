"""The servicer in-process, over a data plane that fails on demand: the error table for the
cases a live server cannot be driven into (UNAVAILABLE, an unexpected exception), and
cancellation of an RPC whose deadline has passed (triton-facts §1.3)."""

from __future__ import annotations

import asyncio
import logging
import types
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, cast

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2, service_pb2_grpc

from server import event_loop
from server.dataplane import DataPlane
from server.errors import (
    InferenceServerError,
    InternalError,
    InvalidArgument,
    ModelLoadError,
    NotFound,
    Unavailable,
    Unsupported,
)
from server.generated import model_config_pb2 as mc
from server.grpc.call import Call
from server.grpc.connection import Http2Connection
from server.grpc.server import GrpcServer
from server.grpc.status import StatusCode, status_code
from server.grpc.stream_window import MAX_HELD_BYTES, MAX_RUNNING
from server.memory.host_pool import HostBufferPool
from server.memory.output_memory import OutputMemory
from server.protocol.grpc_codec import SPLIT_ABOVE_BYTES
from server.protocol.types import InferRequest, InferResponse, OutputTensor
from server.settings import Settings
from tests.collector import alive, collector_off, until_empty
from tests.server.grpc.helpers import SLOW_READER, settled
from tests.server.grpc.raw_http2 import RawHttp2Client, grpc_message

STOPPING = (
    "Server is stopping, scheduler for model has stopped accepting new inference requests"
)


@pytest.mark.parametrize(
    "error, code, http",
    [
        (InvalidArgument("x"), grpc.StatusCode.INVALID_ARGUMENT, 400),
        (ModelLoadError("x"), grpc.StatusCode.INVALID_ARGUMENT, 400),
        (NotFound("x"), grpc.StatusCode.NOT_FOUND, 404),
        (Unavailable("x"), grpc.StatusCode.UNAVAILABLE, 503),
        (Unsupported("x"), grpc.StatusCode.UNIMPLEMENTED, 501),
        (InternalError("x"), grpc.StatusCode.INTERNAL, 500),
    ],
)
def test_status_code_table(error: InferenceServerError, code: grpc.StatusCode, http: int) -> None:
    """The code on the wire is grpc's of the same name."""
    assert (status_code(error).name, status_code(error).value) == (code.name, code.value[0])
    assert error.http_status == http


class FakeDataPlane(DataPlane):
    """The real data plane (readiness, request gate) over no repository: every model exists,
    lookups fail with ``failure`` when it is set, and ``infer`` can be made to hang until
    cancelled (every request, or those in ``hang_ids``)."""

    def __init__(self, ready: bool = True) -> None:
        super().__init__(Settings(strict_readiness=False), None)  # type: ignore[arg-type]
        self.set_live(ready)
        self.failure: BaseException | None = None
        self.hang = False
        self.hang_ids: set[str] = set()
        self.fail_ids: set[str] = set()  # requests that raise RuntimeError("boom")
        self.started = asyncio.Event()
        self.release = asyncio.Event()  # ends the hanging requests
        self.cancelled = asyncio.Event()
        self.echo = False
        # echo's outputs as copies that view "the executor's arena" (``on_release``): each
        # counted, and poisoned when released, so that bytes sent after it are seen wrong
        self.viewed = False
        self.answered = 0
        self.released = 0
        self.address = ""  # the server's, once it listens
        self.arrived: list[str | None] = []  # ids, as each request reaches infer
        self.seen: list[InferRequest] = []

    def _fail(self) -> None:
        if self.failure is not None:
            raise self.failure

    async def model_ready(self, name: str, version: str) -> bool:
        return True

    async def model_metadata(self, name: str, version: str) -> dict[str, Any]:
        self._fail()
        return {"name": name, "versions": ["1"], "platform": "p", "inputs": [], "outputs": []}

    async def model_spec(self, name: str, version: str) -> Any:
        self._fail()
        return None  # decode without checking against a model

    async def model_config(self, name: str, version: str) -> mc.ModelConfig:
        self._fail()
        return mc.ModelConfig(name=name)

    async def infer(
        self, request: InferRequest, memory: OutputMemory | None = None
    ) -> InferResponse:
        self.arrived.append(request.id)
        self._fail()
        if request.id in self.fail_ids:
            raise RuntimeError("boom")
        if self.hang or request.id in self.hang_ids:
            self.started.set()
            try:
                await self.release.wait()
            except asyncio.CancelledError:
                self.cancelled.set()
                raise
        self.seen.append(request)
        if self.echo:  # identity: the outputs are the request's own input arrays
            outputs = [
                OutputTensor(t.name.replace("IN", "OUT"), t.datatype, t.shape,
                             t.data.copy() if self.viewed else t.data)
                for t in request.inputs
            ]
            response = InferResponse(request.model_name, "1", outputs, id=request.id)
            if self.viewed:
                self.answered += 1
                response.on_release = lambda: self._poison(outputs)
            return response
        return InferResponse(request.model_name, "1", [], id=request.id)

    def _poison(self, outputs: list[OutputTensor]) -> None:
        self.released += 1
        for output in outputs:
            output.data.view(np.uint8).fill(0xEE)


Scenario = Callable[
    [FakeDataPlane, service_pb2_grpc.GRPCInferenceServiceStub, grpc.aio.Channel], Awaitable[None]
]


def _run(
    scenario: Scenario,
    ready: bool = True,
    pool: HostBufferPool | None = None,
    client_options: tuple[tuple[str, int], ...] = (),
    receive_into_pool: bool = False,
) -> None:
    """``receive_into_pool``: large requests are received into ``pool`` (as in one process)."""

    async def main() -> None:
        plane = FakeDataPlane(ready)
        server = GrpcServer(plane, pool, buffers=pool if receive_into_pool else None)
        port = server.bind("127.0.0.1", 0)
        plane.address = f"127.0.0.1:{port}"
        await server.start()
        try:
            async with grpc.aio.insecure_channel(
                f"127.0.0.1:{port}", options=client_options
            ) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                await scenario(plane, stub, channel)
                if not plane.gate.closed:  # whatever was refused, the server still answers
                    plane.failure, plane.hang = None, False
                    plane.hang_ids.clear()
                    plane.fail_ids.clear()
                    assert (await stub.ModelInfer(_request("after"))).id == "after"
        finally:
            await server.stop(0)

    event_loop.run(main())


def _request(request_id: str = "") -> service_pb2.ModelInferRequest:
    return service_pb2.ModelInferRequest(model_name="m", id=request_id)


async def _code_and_details(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


def test_unavailable_maps_to_unavailable_on_every_rpc_kind() -> None:
    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, _: grpc.aio.Channel
    ) -> None:
        plane.failure = Unavailable(STOPPING)
        for call in (
            stub.ModelInfer(_request()),
            stub.ModelMetadata(service_pb2.ModelMetadataRequest(name="m")),
            stub.ModelConfig(service_pb2.ModelConfigRequest(name="m")),
        ):
            assert await _code_and_details(call) == (grpc.StatusCode.UNAVAILABLE, STOPPING)

        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield _request("a")

        replies = [reply async for reply in stub.ModelStreamInfer(requests())]
        assert [(r.error_message, r.infer_response.id) for r in replies] == [(STOPPING, "a")]

    _run(scenario)


def test_unexpected_exception_is_internal_with_its_text() -> None:
    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, _: grpc.aio.Channel
    ) -> None:
        plane.failure = RuntimeError("boom")
        code, details = await _code_and_details(stub.ModelInfer(_request()))
        assert code == grpc.StatusCode.INTERNAL
        assert details == "RuntimeError: boom"
        # the stream reports it and stays open for the next request
        plane.failure = None
        plane.fail_ids = {"bad"}
        call = stub.ModelStreamInfer()
        await call.write(_request("bad"))
        first = await asyncio.wait_for(call.read(), timeout=5)
        await call.write(_request("good"))
        second = await asyncio.wait_for(call.read(), timeout=5)
        await call.done_writing()
        replies = [first, second]
        assert [(r.error_message, r.infer_response.id) for r in replies] == [
            ("RuntimeError: boom", "bad"),
            ("", "good"),
        ]

    _run(scenario)


def test_deadline_cancels_the_inference() -> None:
    """An RPC past its deadline does not keep its inference running on the server."""

    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, _: grpc.aio.Channel
    ) -> None:
        plane.hang = True
        code, _details = await _code_and_details(stub.ModelInfer(_request(), timeout=0.5))
        assert code == grpc.StatusCode.DEADLINE_EXCEEDED
        assert plane.started.is_set()
        await asyncio.wait_for(plane.cancelled.wait(), timeout=5)

    _run(scenario)


def test_client_cancel_cancels_the_inference() -> None:
    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, _: grpc.aio.Channel
    ) -> None:
        plane.hang = True
        call = stub.ModelInfer(_request())
        await asyncio.wait_for(plane.started.wait(), timeout=5)
        call.cancel()
        await asyncio.wait_for(plane.cancelled.wait(), timeout=5)

    _run(scenario)


@pytest.mark.parametrize(
    "ready, status",
    [
        (True, health_pb2.HealthCheckResponse.SERVING),
        (False, health_pb2.HealthCheckResponse.NOT_SERVING),
    ],
)
def test_health_follows_readiness(ready: bool, status: int) -> None:
    async def scenario(
        plane: FakeDataPlane,
        stub: service_pb2_grpc.GRPCInferenceServiceStub,
        channel: grpc.aio.Channel,
    ) -> None:
        # types-grpcio-health-checking declares HealthStub without its Check and Watch.
        health = health_pb2_grpc.HealthStub(channel)
        for service in ("", "inference.GRPCInferenceService"):
            reply = await health.Check(  # type: ignore[attr-defined]
                health_pb2.HealthCheckRequest(service=service)
            )
            assert reply.status == status
        assert (await stub.ServerReady(service_pb2.ServerReadyRequest())).ready is ready

    _run(scenario, ready=ready)


def test_stream_replies_as_each_request_completes_and_cancel_stops_the_rest() -> None:
    """A slow request does not hold back the replies of later ones; cancelling the stream
    cancels what is still running."""

    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, _: grpc.aio.Channel
    ) -> None:
        plane.hang_ids = {"slow"}
        call = stub.ModelStreamInfer()
        await call.write(_request("slow"))
        await asyncio.wait_for(plane.started.wait(), timeout=5)
        await call.write(_request("fast"))
        reply = await asyncio.wait_for(call.read(), timeout=5)
        assert (reply.error_message, reply.infer_response.id) == ("", "fast")
        assert not plane.cancelled.is_set()
        call.cancel()
        await asyncio.wait_for(plane.cancelled.wait(), timeout=5)

    _run(scenario)


def test_stream_runs_a_bounded_number_of_requests_at_once() -> None:
    """Requests that do not finish stop the stream reading more at ``MAX_RUNNING``; the client's
    other requests wait unread, and are read once the running ones are answered."""

    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, _: grpc.aio.Channel
    ) -> None:
        ids = [f"r{i}" for i in range(3 * MAX_RUNNING)]
        plane.hang_ids = set(ids)
        call = stub.ModelStreamInfer()
        for request_id in ids:
            await call.write(_request(request_id))
        await call.done_writing()
        assert await settled(lambda: len(plane.arrived)) == MAX_RUNNING
        plane.release.set()
        replies = [reply.infer_response.id async for reply in call]
        # Every request here has an id.
        assert sorted(replies) == sorted(ids) == sorted(cast("list[str]", plane.arrived))

    _run(scenario)


def test_stream_whose_replies_go_unread_stops_reading_requests() -> None:
    """A client that writes 1 MiB requests and reads nothing: the stream reads requests only
    while it holds under ``MAX_HELD_BYTES`` of them and their replies. Once the client reads,
    every reply comes, each with its own request's data."""
    size = 2**20
    count = 2 * MAX_HELD_BYTES // size

    def request(i: int) -> service_pb2.ModelInferRequest:
        message = _request(f"r{i}")
        message.inputs.add(name="IN0", datatype="INT32", shape=[size // 4])
        message.raw_input_contents.append(np.full(size // 4, i, np.int32).tobytes())
        return message

    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, _: grpc.aio.Channel
    ) -> None:
        plane.echo = True
        call = stub.ModelStreamInfer()

        async def write() -> None:
            for i in range(count):
                await call.write(request(i))
            await call.done_writing()

        writer = asyncio.create_task(write())
        read = await settled(lambda: len(plane.arrived))
        assert read <= MAX_HELD_BYTES // size + 1, read
        replies = [reply async for reply in call]
        await asyncio.wait_for(writer, 10)
        assert sorted(r.infer_response.id for r in replies) == sorted(f"r{i}" for i in range(count))
        for reply in replies:
            i = int(reply.infer_response.id[1:])
            assert reply.infer_response.raw_output_contents == [request(i).raw_input_contents[0]]

    _run(scenario, client_options=SLOW_READER)


def test_closed_gate_refuses_inference_with_unavailable() -> None:
    """Shutting down: new requests are refused with UNAVAILABLE and Triton's text, unary and
    streamed alike; readiness turns false."""

    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, _: grpc.aio.Channel
    ) -> None:
        assert (await stub.ModelInfer(_request("before"))).id == "before"
        plane.gate.close()
        assert await _code_and_details(stub.ModelInfer(_request())) == (
            grpc.StatusCode.UNAVAILABLE,
            STOPPING,
        )

        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            yield _request("late")

        replies = [reply async for reply in stub.ModelStreamInfer(requests())]
        assert [(r.error_message, r.infer_response.id) for r in replies] == [(STOPPING, "late")]
        assert (await stub.ServerReady(service_pb2.ServerReadyRequest())).ready is False

    _run(scenario)


def test_stream_ends_with_the_error_when_reading_requests_fails() -> None:
    """A request stream that breaks must end the reply stream with that error, not hang."""
    from server.grpc.servicer import InferenceServicer

    async def broken() -> AsyncIterator[bytes]:
        raise RuntimeError("the client's stream broke")
        yield b""  # pragma: no cover - makes this an async generator

    async def scenario() -> None:
        servicer = InferenceServicer(None)  # type: ignore[arg-type]
        context = types.SimpleNamespace(invocation_metadata=lambda: ())  # a call's, no metadata
        replies = servicer.ModelStreamInfer(broken(), context)
        with pytest.raises(RuntimeError, match="stream broke"):
            await asyncio.wait_for(replies.__anext__(), 5)

    event_loop.run(scenario())


class FakePinned:
    """CuPy's pinned allocation stand-in: plain memory whose arrays it remembers."""

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []

    def __call__(self, nbytes: int) -> np.ndarray:
        array = np.empty(nbytes, dtype=np.uint8)
        self.arrays.append(array)
        return array


@pytest.mark.parametrize(
    "arrays, received_into_pool",
    [
        ((np.arange(1000, dtype=np.float32), np.arange(16, dtype=np.int32)), False),
        ((np.arange(100_000, dtype=np.float32),), True),
    ],
    ids=["copied-once", "received-pinned"],
)
@pytest.mark.parametrize("streamed", [False, True], ids=["ModelInfer", "ModelStreamInfer"])
def test_with_a_gpu_raw_inputs_reach_the_data_plane_in_one_pinned_buffer(
    arrays: tuple[np.ndarray, ...], received_into_pool: bool, streamed: bool
) -> None:
    """The raw input bytes reach the data plane in the pool's pinned buffer (copied once, or
    -- a large request the transport received into the pool -- where they were received, with
    no second pinned copy), the reply carries them intact (also when an output is a view of an
    input), and the buffer goes back to the pool once the reply is made."""
    fake = FakePinned()
    pool = HostBufferPool(pinned_limit=1 << 24, pinned_allocator=fake)

    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, _: grpc.aio.Channel
    ) -> None:
        plane.echo = True
        request = _request("pinned")
        for index, array in enumerate(arrays):
            datatype = "FP32" if array.dtype == np.float32 else "INT32"
            request.inputs.add(name=f"IN{index}", datatype=datatype, shape=list(array.shape))
            request.raw_input_contents.append(array.tobytes())
        stream = stub.ModelStreamInfer() if streamed else None
        for _round in range(3):
            if stream is None:
                reply = await stub.ModelInfer(request)
            else:
                await stream.write(request)
                reply = (await stream.read()).infer_response
            assert reply.raw_output_contents == [array.tobytes() for array in arrays]
            (seen,) = plane.seen
            plane.seen.clear()
            (pinned,) = fake.arrays
            for tensor in seen.inputs:
                assert np.shares_memory(tensor.data, pinned), tensor.name
            assert await settled(lambda: pool.stats().pinned_used, quiet=0.05) == 0
        if stream is not None:
            await stream.done_writing()
        assert pool.stats().allocations == 1, "one pinned buffer, reused"

    _run(scenario, pool=pool, receive_into_pool=received_into_pool)


def test_without_a_gpu_raw_inputs_stay_where_protobuf_put_them() -> None:
    pool = HostBufferPool()  # no CUDA here: nothing is pinned

    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, _: grpc.aio.Channel
    ) -> None:
        plane.echo = True
        request = _request("plain")
        request.inputs.add(name="IN0", datatype="INT32", shape=[4])
        request.raw_input_contents.append(np.arange(4, dtype=np.int32).tobytes())
        reply = await stub.ModelInfer(request)
        assert reply.raw_output_contents == [np.arange(4, dtype=np.int32).tobytes()]
        assert pool.stats().allocations == 0

    _run(scenario, pool=pool)


@pytest.mark.parametrize("size", [16, SPLIT_ABOVE_BYTES + 16])
def test_a_malformed_request_is_invalid_argument_and_the_server_goes_on(size: int) -> None:
    """Small requests are parsed by protobuf whole, large ones split field by field: either
    way undecodable bytes are INVALID_ARGUMENT (``_run`` then checks a good request is
    answered)."""
    # A raw-contents field claiming more bytes than the message holds, padded to ``size``.
    data = bytes([7 << 3 | 2]) + b"\xff\xff\xff\x0f" + bytes(size)

    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, channel: grpc.aio.Channel
    ) -> None:
        infer: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = channel.unary_unary(
            "/inference.GRPCInferenceService/ModelInfer"
        )
        code, details = await _code_and_details(infer(data))
        assert code == grpc.StatusCode.INVALID_ARGUMENT
        assert details.startswith("malformed ModelInferRequest"), details
        assert plane.arrived == []

    _run(scenario)


def _large(request_id: str, size: int = 2**20) -> service_pb2.ModelInferRequest:
    message = _request(request_id)
    message.inputs.add(name="IN0", datatype="INT32", shape=[size // 4])
    message.raw_input_contents.append(
        np.full(size // 4, sum(map(ord, request_id)), np.int32).tobytes()
    )
    return message


def test_replies_in_the_executors_arena_are_written_from_it_and_released_once_sent() -> None:
    """Outputs that view the executor's arena (``on_release``) are sent from there, unary and
    streamed, each reply's memory released once all of it is written: a release before would
    put its poison on the wire. The client's 64 KiB window (no BDP probing) keeps most of each
    1 MiB reply waiting in the server while the rest goes."""

    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, _: grpc.aio.Channel
    ) -> None:
        plane.echo = plane.viewed = True
        requests = [_large(f"u{i}") for i in range(4)] + [_large("small", 4096)]
        replies = await asyncio.gather(*(stub.ModelInfer(r) for r in requests))
        streamed = [reply.infer_response async for reply in stub.ModelStreamInfer(iter(requests))]
        assert [r.id for r in replies] == [r.id for r in requests]
        assert sorted(r.id for r in streamed) == sorted(r.id for r in requests)
        sent = {r.id: r.raw_input_contents[0] for r in requests}
        for reply in [*replies, *streamed]:
            assert reply.raw_output_contents == [sent[reply.id]], reply.id
        assert plane.answered == 10
        assert await settled(lambda: plane.released) == 10

    _run(scenario, client_options=SLOW_READER)


def test_replies_in_the_executors_arena_are_released_when_their_calls_are_given_up() -> None:
    """Large replies a client leaves unread, then resets (a stream cancelled) or drops with its
    connection: every one is released."""

    async def scenario(
        plane: FakeDataPlane, stub: service_pb2_grpc.GRPCInferenceServiceStub, _: grpc.aio.Channel
    ) -> None:
        plane.echo = plane.viewed = True
        call = stub.ModelStreamInfer(iter([_large(f"s{i}") for i in range(4)]))
        assert await settled(lambda: plane.answered) == 4
        assert plane.released < 4  # most of them wait for the client to read
        call.cancel()
        async with grpc.aio.insecure_channel(plane.address, options=SLOW_READER) as other:
            dropped = service_pb2_grpc.GRPCInferenceServiceStub(other).ModelStreamInfer(
                iter([_large(f"d{i}") for i in range(4)])
            )
            assert await settled(lambda: plane.answered) == 8
        # (the connection went with the replies unread)
        assert await settled(lambda: plane.released) == 8
        dropped.cancel()

    _run(scenario, client_options=SLOW_READER)


def test_closed_connections_and_their_calls_are_freed_without_the_collector() -> None:
    """Nothing refers back to a closed connection or to a finished call (unary, streamed, one
    failed), so their reference counts free them and their buffers at once. (The client is
    the raw one: grpcio's keeps a failed call, and its connection, until a collection.)"""

    def calls(port: int) -> list[int | None]:
        service = "/inference.GRPCInferenceService/"
        raw = RawHttp2Client(port)
        try:
            unary = raw.call(service + "ModelInfer", _large("unary", 2**13).SerializeToString())
            failed = raw.call(service + "ModelInfer", _request("failed").SerializeToString())
            stream = raw.start(service + "ModelStreamInfer")
            for request in (_large("a", 2**13), _request("b")):
                raw.h2.send_data(stream, grpc_message(request.SerializeToString()))
                raw.flush()
            raw.h2.end_stream(stream)
            raw.flush()
            streamed = raw.finish(stream)
            assert len(streamed.messages()) == 2
            return [unary.status, failed.status, streamed.status]
        finally:
            raw.close()

    async def main() -> None:
        plane = FakeDataPlane()
        plane.echo = True
        plane.fail_ids.add("failed")
        server = GrpcServer(plane, None)
        port = server.bind("127.0.0.1", 0)
        await server.start()
        # pytest keeps every record logged, and the failed call's keeps its traceback
        logging.disable(logging.ERROR)
        try:
            with collector_off():
                before = alive(Http2Connection, Call)
                for _ in range(5):
                    statuses = await asyncio.to_thread(calls, port)
                    assert statuses == [StatusCode.OK, StatusCode.INTERNAL, StatusCode.OK]
                await until_empty(server._service.connections)
                assert alive(Http2Connection, Call) == before
        finally:
            logging.disable(logging.NOTSET)
            await server.stop(0)

    event_loop.run(main())
