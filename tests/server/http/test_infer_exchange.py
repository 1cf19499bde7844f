"""The infer fast path (``InferExchange`` under ``Routes``), in process, around a fake plane:
keep-alive across it and the application, cancellation and buffer release whenever the client
goes away, the server gate, faults. The wire answers themselves are pinned by the suites that
run the real server."""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import struct
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any, cast

import numpy as np
import pytest
from tornado import httputil
from tornado.netutil import bind_sockets

from server import event_loop
from server.errors import NotFound
from server.generated import model_config_pb2 as mc
from server.http.endpoint import service as http_service
from server.http.exchange import Exchange
from server.http.headers import RequestHeaders
from server.http.infer import INFER_PATH, InferExchange, InferService, _decoding_cost
from server.http.server import Routes
from server.listener import Listener
from server.memory.host_pool import HostBufferPool
from server.plane import Plane
from server.protocol.datatypes import from_name
from server.protocol.model_spec import ModelSpec, TensorSpec
from server.protocol.types import InferRequest, InferResponse, OutputTensor
from server.request_gate import STOPPING, RequestGate
from server.settings import Settings

INT32 = from_name("INT32")
SPEC = ModelSpec(
    name="echo",
    max_batch_size=0,
    inputs={"IN": TensorSpec("IN", INT32, (4,), None)},
    outputs={"OUT": TensorSpec("OUT", INT32, (4,), None)},
)
DATA = struct.pack("<4i", 1, 2, 3, 4)


class FakePlane:
    """Serves model ``echo`` (its input back as ``OUT``); ``hold`` keeps requests running;
    ``remote`` stands for a front end's plane."""

    def __init__(self, remote: bool = False) -> None:
        self.gate = RequestGate()
        self.remote = remote
        self.hold = False
        self.release = asyncio.Event()
        self.started = asyncio.Event()
        self.cancelled = asyncio.Event()
        self.fault: Exception | None = None

    def live(self) -> bool:
        return True

    async def model_spec(self, name: str, version: str) -> ModelSpec:
        if name != "echo":
            raise NotFound(f"Request for unknown model: '{name}' is not found")
        return SPEC

    async def infer(self, request: InferRequest) -> InferResponse:
        self.started.set()
        try:
            if self.hold:
                await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.set()
            raise
        if self.fault is not None:
            raise self.fault
        data = np.array(request.inputs[0].data)  # a copy: the body is released after this
        return InferResponse("echo", "1", [OutputTensor("OUT", INT32, (4,), data)], request.id)


def infer_request(path: str = "/v2/models/echo/infer", extra: str = "") -> bytes:
    header = json.dumps(
        {
            "inputs": [
                {"name": "IN", "datatype": "INT32", "shape": [4],
                 "parameters": {"binary_data_size": 16}},
            ],
            "parameters": {"binary_data_output": True},
        }
    ).encode()
    body = header + DATA
    head = (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
        f"Inference-Header-Content-Length: {len(header)}\r\n{extra}\r\n"
    )
    return head.encode() + body


async def read_answer(reader: asyncio.StreamReader) -> tuple[int, dict[str, str], bytes]:
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    lines = head.decode("latin1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = dict(line.split(": ", 1) for line in lines[1:] if line)
    body = await reader.readexactly(int(headers.get("Content-Length", "0")))
    return status, headers, body


class Served:
    def __init__(self, plane: FakePlane, pool: HostBufferPool, port: int) -> None:
        self.plane = plane
        self.pool = pool
        self.port = port

    async def connect(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        return await asyncio.open_connection("127.0.0.1", self.port)


@asynccontextmanager
async def serving(settings: Settings, remote: bool = False) -> AsyncIterator[Served]:
    plane = FakePlane(remote)
    pool = HostBufferPool(pinned_limit=0)
    server = http_service(
        Routes(cast(Plane, plane), settings, pool),
        body_timeout_secs=settings.http_body_timeout_secs,
    )
    listener = Listener(server, bind_sockets(0, "127.0.0.1"), "test")
    try:
        yield Served(plane, pool, listener.port)
    finally:
        listener.close()
        await server.close_all_connections()


def run(
    scenario: Callable[[Served], Awaitable[None]],
    settings: Settings | None = None,
    remote: bool = False,
) -> None:
    async def main() -> None:
        async with serving(settings or Settings(), remote) as served:
            await scenario(served)

    event_loop.run(main())


async def until(condition: Callable[[], bool]) -> None:
    for _ in range(1000):
        if condition():
            return
        await asyncio.sleep(0.005)
    raise AssertionError("condition not reached")


def test_one_connection_serves_infer_and_the_application_in_turn() -> None:
    async def scenario(served: Served) -> None:
        reader, writer = await served.connect()
        for request in (
            infer_request(),
            b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n",
            infer_request("/v2/models/ech%6F/versions/1/infer?x=1"),
        ):
            writer.write(request)
            status, headers, body = await read_answer(reader)
            assert status == 200, body
            if headers.get("Content-Type") == "application/octet-stream":
                length = int(headers["Inference-Header-Content-Length"])
                assert body[length:] == DATA
                assert json.loads(body[:length])["outputs"][0]["name"] == "OUT"
        writer.close()

    run(scenario)


def test_header_names_in_any_case_and_values_with_spaces_around_are_read() -> None:
    """The infer path reads its headers by name in any case, each value without the spaces
    around it: lower-case names, and ``close`` with a trailing space, still close."""
    async def scenario(served: Served) -> None:
        head, _, body = infer_request(extra="CONNECTION:  close \r\n").partition(b"\r\n\r\n")
        request_line, *fields = head.split(b"\r\n")
        lowered = [name.lower() + b":" + value for name, _, value in
                   (field.partition(b":") for field in fields)]
        reader, writer = await served.connect()
        writer.write(b"\r\n".join([request_line, *lowered]) + b"\r\n\r\n" + body)
        status, headers, answer = await read_answer(reader)
        assert status == 200, answer
        assert answer[int(headers["Inference-Header-Content-Length"]):] == DATA
        assert headers["Connection"] == "close"
        assert await asyncio.wait_for(reader.read(), 10) == b""
        writer.close()

    run(scenario)


async def serves_a_good_request(served: Served) -> None:
    """The server still answers a valid request, on a fresh connection."""
    reader, writer = await served.connect()
    writer.write(infer_request())
    status, _, body = await read_answer(reader)
    assert status == 200, body
    writer.close()


def test_other_methods_on_the_infer_route_are_the_application_s_405() -> None:
    async def scenario(served: Served) -> None:
        reader, writer = await served.connect()
        writer.write(b"GET /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _headers, body = await read_answer(reader)
        assert (status, json.loads(body)) == (405, {"error": "Method Not Allowed"})
        writer.close()
        await serves_a_good_request(served)

    run(scenario)


@pytest.mark.parametrize("remote", [False, True], ids=["one process", "front end"])
def test_pipelined_requests_with_a_refused_one_are_answered_in_order(remote: bool) -> None:
    """Three requests in one write, the middle one for an unknown model: each is answered, in
    order, the refused one with its error; no body stays held, and the connection goes on
    serving (in a front end each request leaves within the read, ``finish``)."""
    async def scenario(served: Served) -> None:
        reader, writer = await served.connect()
        writer.write(
            infer_request() + infer_request("/v2/models/nobody/infer") + infer_request()
        )
        answers = [await read_answer(reader) for _ in range(3)]
        assert [status for status, _, _ in answers] == [200, 404, 200], answers
        assert json.loads(answers[1][2]) == {
            "error": "Request for unknown model: 'nobody' is not found"
        }
        assert answers[0][2].endswith(DATA) and answers[2][2].endswith(DATA)
        assert served.pool.bytes_in_use == 0
        writer.close()
        await serves_a_good_request(served)

    run(scenario, remote=remote)


def test_a_client_gone_while_its_request_runs_cancels_it_and_frees_its_body() -> None:
    async def scenario(served: Served) -> None:
        served.plane.hold = True
        _reader, writer = await served.connect()
        writer.write(infer_request())
        await asyncio.wait_for(served.plane.started.wait(), 10)
        assert served.pool.bytes_in_use > 0
        writer.close()
        await asyncio.wait_for(served.plane.cancelled.wait(), 10)
        await until(lambda: served.pool.bytes_in_use == 0)
        assert served.plane.gate.inside == 0

    run(scenario)


def test_a_client_gone_mid_body_frees_its_buffer() -> None:
    async def scenario(served: Served) -> None:
        _reader, writer = await served.connect()
        writer.write(b"POST /v2/models/echo/infer HTTP/1.1\r\nContent-Length: 1000\r\n\r\n")
        writer.write(b"{" * 10)
        await until(lambda: served.pool.bytes_in_use > 0)
        writer.close()
        await until(lambda: served.pool.bytes_in_use == 0)
        assert not served.plane.started.is_set()

    run(scenario)


def test_a_stalled_body_is_cut_off_and_its_buffer_freed(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(served: Served) -> None:
        reader, writer = await served.connect()
        writer.write(b"POST /v2/models/echo/infer HTTP/1.1\r\nContent-Length: 1000\r\n\r\n{")
        await until(lambda: served.pool.bytes_in_use > 0)
        assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, nothing said
        await until(lambda: served.pool.bytes_in_use == 0)
        writer.close()
        await serves_a_good_request(served)

    with caplog.at_level(logging.INFO, logger="tornado.general"):
        run(scenario, Settings(http_body_timeout_secs=0.2))  # type: ignore[arg-type]
    assert "Timeout reading body from 127.0.0.1" in caplog.text


class _Connection:
    """The parts of a connection's ``Exchange`` an infer exchange uses, recording what it is
    told."""

    context = None

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.close_callback: Callable[[], None] | None = None
        self.answers: list[tuple[int, bytes]] = []
        self.finished = False

    def set_close_callback(self, callback: Callable[[], None] | None) -> None:
        self.close_callback = callback

    def receive_into(self, sink: object) -> None:
        pass

    def write_headers(self, *args: Any) -> None:
        raise AssertionError("nobody is left to answer")

    def write_answer(self, code: int, reason: str, fields: object, body: bytes) -> None:
        self.answers.append((code, body))

    def finish(self) -> None:
        self.finished = True


def _received(plane: FakePlane, pool: HostBufferPool, connection: _Connection) -> InferExchange:
    """An exchange that has had a whole infer request, up to ``finish`` (not called)."""
    service = InferService(cast(Plane, plane), Settings(), pool)
    head, _, body = infer_request().partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    start_line = httputil.parse_request_start_line(lines[0])
    fields = []
    for line in lines[1:]:
        name, _, value = line.partition(":")
        fields.append((name.encode(), value.strip().encode()))
    headers = RequestHeaders(fields)
    path = INFER_PATH.match(start_line.path)
    assert path is not None
    exchange = InferExchange(service, cast(Exchange, connection), path)
    exchange.headers_received(start_line, headers)
    exchange.data_received(body)
    return exchange


def test_a_client_gone_before_its_task_starts_frees_the_body_and_nothing_runs() -> None:
    async def scenario() -> None:
        plane = FakePlane()
        pool = HostBufferPool(pinned_limit=0)
        connection = _Connection()
        exchange = _received(plane, pool, connection)
        exchange.finish()  # the task is created, not yet started
        assert pool.bytes_in_use > 0
        assert connection.close_callback is not None
        connection.close_callback()
        for _ in range(5):
            await asyncio.sleep(0)
        assert pool.bytes_in_use == 0  # freed once the cancelled task is done
        assert not plane.started.is_set()

    event_loop.run(scenario())


def test_in_a_front_end_the_request_leaves_within_finish_and_a_gone_client_cancels_it() -> None:
    """A front end's plane gets the request before ``finish`` returns (within the read that
    completed it); the body stays held while the request waits for its answer, and is freed
    once the client's going away has cancelled it."""
    async def scenario() -> None:
        plane = FakePlane(remote=True)
        plane.hold = True
        pool = HostBufferPool(pinned_limit=0)
        connection = _Connection()
        exchange = _received(plane, pool, connection)
        exchange.finish()
        assert plane.started.is_set()
        await asyncio.sleep(0)
        assert pool.bytes_in_use > 0 and not plane.cancelled.is_set()
        assert connection.close_callback is not None
        connection.close_callback()
        for _ in range(5):
            await asyncio.sleep(0)
        assert plane.cancelled.is_set() and pool.bytes_in_use == 0

    event_loop.run(scenario())


def test_in_a_front_end_a_request_refused_within_finish_frees_its_body() -> None:
    async def scenario() -> None:
        plane = FakePlane(remote=True)
        plane.gate.close()
        pool = HostBufferPool(pinned_limit=0)
        connection = _Connection()
        exchange = _received(plane, pool, connection)
        exchange.finish()  # answered 503 within this call: no task
        assert pool.bytes_in_use == 0 and connection.finished
        assert [code for code, _ in connection.answers] == [503]

    event_loop.run(scenario())


@pytest.mark.parametrize("remote", [False, True], ids=["one process", "front end"])
def test_a_closed_gate_answers_503_after_reading_the_body(remote: bool) -> None:
    """In a front end the refusal is written within ``finish`` (no task), the same way."""
    async def scenario(served: Served) -> None:
        served.plane.gate.close()
        reader, writer = await served.connect()
        for _ in range(2):  # the connection stays usable
            writer.write(infer_request())
            status, headers, body = await read_answer(reader)
            assert (status, json.loads(body)) == (503, {"error": STOPPING})
            assert "Connection" not in headers
        assert served.pool.bytes_in_use == 0
        writer.close()

    run(scenario, remote=remote)


def test_a_fault_behind_the_plane_is_500_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(served: Served) -> None:
        served.plane.fault = RuntimeError("boom")
        reader, writer = await served.connect()
        writer.write(infer_request())
        status, _, body = await read_answer(reader)
        assert (status, json.loads(body)) == (500, {"error": "RuntimeError: boom"})
        assert served.pool.bytes_in_use == 0
        served.plane.fault = None  # the same connection serves the next request
        writer.write(infer_request())
        status, _, body = await read_answer(reader)
        assert status == 200, body
        writer.close()

    with caplog.at_level(logging.ERROR, logger="server.http"):
        run(scenario)
    assert "internal error for request id None to model 'echo'" in caplog.text


def test_answered_requests_leave_nothing_for_the_garbage_collector() -> None:
    """Each answered request's objects are freed by reference counting: none is left in a
    reference cycle (which only the collector would free, 17 objects a request before)."""
    async def scenario(served: Served) -> None:
        reader, writer = await served.connect()
        writer.write(infer_request())
        await read_answer(reader)  # the first request's one-time objects are made
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            for _ in range(20):
                writer.write(infer_request())
                status, _, body = await read_answer(reader)
                assert status == 200, body
            await asyncio.sleep(0.01)  # every task's done callbacks have run
            gc.collect()
            kinds = {type(item).__name__ for item in gc.garbage}
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
        assert not kinds & {"InferExchange", "Exchange", "_Dispatch", "Task"}, kinds
        writer.close()

    run(scenario)


def test_the_rest_of_a_large_body_is_read_into_its_buffer_and_the_connection_goes_on(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A body with 64 KiB or more still to come after its first bytes is read by the socket
    straight into the request's buffer (``Exchange.body_filled``, not ``data_received``); the
    answer is right, and the next request on the connection (a fresh parser) is served."""
    filled: list[int] = []
    real = Exchange.body_filled

    def counting(self: Exchange, nbytes: int) -> bool:
        filled.append(nbytes)
        return real(self, nbytes)

    monkeypatch.setattr(Exchange, "body_filled", counting)

    async def scenario(served: Served) -> None:
        header = json.dumps(
            {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [4],
                         "parameters": {"binary_data_size": 16}}],
             "parameters": {"binary_data_output": True}}
        ).encode() + b" " * 200_000  # padding: JSON allows it
        body = header + DATA
        head = (
            f"POST /v2/models/echo/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\n\r\n"
        ).encode()
        reader, writer = await served.connect()
        writer.write(head + body[:100])
        await asyncio.sleep(0.05)  # headers and the first bytes are parsed
        writer.write(body[100:])
        status, headers, answer = await read_answer(reader)
        assert status == 200, answer
        length = int(headers["Inference-Header-Content-Length"])
        assert answer[length:] == DATA
        assert sum(filled) == len(body) - 100
        writer.write(infer_request())
        status, _, answer = await read_answer(reader)
        assert status == 200 and answer.endswith(DATA), answer
        writer.close()

    run(scenario)


def _spec(*datatypes: str) -> ModelSpec:
    config = mc.ModelConfig(name="m")
    for index, datatype in enumerate(datatypes):
        config.input.add(name=f"IN{index}", data_type=mc.DataType.Value(datatype), dims=[-1])
    return ModelSpec.from_config(config)


def test_a_binary_body_costs_its_json_header_unless_elements_are_read_one_by_one() -> None:
    size, header = 16 << 20, 200
    assert _decoding_cost(size, None, _spec("TYPE_FP32")) == size  # all JSON
    assert _decoding_cost(size, header, _spec("TYPE_FP32", "TYPE_INT8")) == header  # views
    assert _decoding_cost(size, 0, _spec("TYPE_FP32")) == 0  # raw binary: one view
    assert _decoding_cost(size, header, _spec("TYPE_FP32", "TYPE_STRING")) == size  # BYTES
    assert _decoding_cost(size, 0, _spec("TYPE_BOOL")) == size  # each BOOL checked
