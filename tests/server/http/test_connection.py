"""The HTTP/1.x connection (``server.http.connection``) under a small Tornado application, on
raw sockets: keep-alive as Tornado decides it, pipelined requests answered in order, chunked
bodies both ways, ``100 Continue``, malformed and oversize requests, idle connections, answers
made of views that must stay untouched until the kernel has them, and a client gone while its
answer is being made."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import pytest
import tornado.web
from tornado.netutil import bind_sockets

from server import event_loop
from server.http.connection import HttpConnection, HttpService
from server.http.delegates import TornadoDelegate
from server.http.endpoint import service
from server.listener import Listener
from tests.collector import alive, collector_off, until_empty

BIG = 8 << 20


class _Echo(tornado.web.RequestHandler):
    def get(self) -> None:
        self.write(f"path={self.request.path} q={self.get_argument('q', '')}")

    def post(self) -> None:
        self.write(b"got " + self.request.body)


class _Slow(tornado.web.RequestHandler):
    async def get(self) -> None:
        await asyncio.sleep(0.05)
        self.write("slow")


class _Chunked(tornado.web.RequestHandler):
    async def get(self) -> None:
        self.write("one,")
        await self.flush()
        self.write("two")


class _Views(tornado.web.RequestHandler):
    """A large answer written as a view of a buffer that is overwritten once the write is
    reported done: the client must still get the first contents."""

    async def get(self) -> None:
        buffer = bytearray(b"a" * BIG)
        self.set_header("Content-Length", str(BIG))
        await self.flush()
        await self.request.connection.write(memoryview(buffer))  # type: ignore[union-attr, arg-type]
        buffer[:] = b"b" * BIG
        self.finish()


class _Hang(tornado.web.RequestHandler):
    closed: asyncio.Event

    async def get(self) -> None:
        await asyncio.sleep(30)

    def on_connection_close(self) -> None:
        _Hang.closed.set()


@tornado.web.stream_request_body
class _Stream(tornado.web.RequestHandler):
    def prepare(self) -> None:
        self.pieces: list[bytes] = []

    def data_received(self, chunk: bytes) -> None:
        self.pieces.append(chunk)

    def put(self) -> None:
        self.write(b"streamed " + b"".join(self.pieces))


class _Headers(tornado.web.RequestHandler):
    def get(self) -> None:
        headers = self.request.headers
        self.write(",".join(headers.get_list("X-Many")) + "|" + headers["Accept"])


@tornado.web.stream_request_body
class _Refuse(tornado.web.RequestHandler):
    """Answers before the body has come, as the infer path does when it has no room for it."""

    def prepare(self) -> None:
        self.set_status(503)
        self.finish("no room")


def _app() -> tornado.web.Application:
    return tornado.web.Application([
        ("/echo", _Echo), ("/slow", _Slow), ("/chunked", _Chunked), ("/views", _Views),
        ("/hang", _Hang), ("/stream", _Stream), ("/refuse", _Refuse), ("/headers", _Headers),
    ])


@asynccontextmanager
async def serving(**limits: float) -> AsyncIterator[tuple[HttpService, int]]:
    http = service(TornadoDelegate(_app()), **limits)  # type: ignore[arg-type]
    listener = Listener(http, bind_sockets(0, "127.0.0.1"), "test")
    try:
        yield http, listener.port
    finally:
        listener.close()
        await http.close_all_connections()


def run(scenario: Callable[[int], Awaitable[None]], **limits: float) -> None:
    async def main() -> None:
        async with serving(**limits) as (_, port):
            await asyncio.wait_for(scenario(port), 20)

    event_loop.run(main())


async def read_answer(reader: asyncio.StreamReader) -> tuple[str, dict[str, str], bytes]:
    """One answer: its status line, headers and body (by Content-Length or chunks)."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin1")
    status, *lines = head.split("\r\n")
    headers = dict(line.split(": ", 1) for line in lines if line)
    if headers.get("Transfer-Encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readuntil(b"\r\n"))[:-2], 16)
            body += (await reader.readexactly(size + 2))[:-2]
            if size == 0:
                return status, headers, body
    return status, headers, await reader.readexactly(int(headers.get("Content-Length", "0")))


async def exchange(port: int, sent: bytes) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(sent)
    return reader, writer


async def serves_a_good_request(port: int) -> None:
    """A fresh connection is still answered."""
    reader, writer = await exchange(port, b"GET /echo?q=ok HTTP/1.1\r\nHost: x\r\n\r\n")
    assert (await read_answer(reader))[2] == b"path=/echo q=ok"
    writer.close()


def test_keep_alive_serves_many_requests_on_one_connection() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await exchange(port, b"GET /echo?q=1 HTTP/1.1\r\nHost: x\r\n\r\n")
        status, headers, body = await read_answer(reader)
        assert (status, body) == ("HTTP/1.1 200 OK", b"path=/echo q=1")
        assert headers["Content-Length"] == "14"
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabc")
        status, headers, body = await read_answer(reader)
        assert (status, body) == ("HTTP/1.1 200 OK", b"got abc")
        assert "Connection" not in headers
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, headers, body = await read_answer(reader)
        assert headers["Connection"] == "close"
        assert await reader.read() == b""  # closed after the answer
        writer.close()

    run(scenario)


def test_the_application_sees_every_header_line() -> None:
    """Tornado's handlers get Tornado's headers: a name sent twice keeps both lines, values
    are latin-1 and lose the spaces around them."""
    async def scenario(port: int) -> None:
        reader, writer = await exchange(
            port,
            b"GET /headers HTTP/1.1\r\nHost: x\r\nX-Many: a\r\nx-many: b \r\n"
            b"Accept: \xe9t\xe9\r\n\r\n",
        )
        status, _, body = await read_answer(reader)
        assert (status, body.decode()) == ("HTTP/1.1 200 OK", "a,b|\xe9t\xe9")
        writer.close()

    run(scenario)


def test_http_1_0_closes_unless_asked_to_keep_alive() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await exchange(port, b"GET /echo HTTP/1.0\r\n\r\n")
        status, headers, body = await read_answer(reader)
        assert (status, body) == ("HTTP/1.1 200 OK", b"path=/echo q=")
        assert await reader.read() == b""
        writer.close()
        reader, writer = await exchange(port, b"GET /echo HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        status, headers, body = await read_answer(reader)
        assert headers["Connection"] == "Keep-Alive"
        writer.write(b"GET /echo?q=2 HTTP/1.0\r\nConnection: keep-alive\r\n\r\n")
        assert (await read_answer(reader))[2] == b"path=/echo q=2"
        writer.close()

    run(scenario)


def test_pipelined_requests_are_answered_in_order() -> None:
    async def scenario(port: int) -> None:
        requests = (
            b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi"
            b"GET /echo?q=3 HTTP/1.1\r\nHost: x\r\n\r\n"
        )
        reader, writer = await exchange(port, requests)
        bodies = [(await read_answer(reader))[2] for _ in range(3)]
        assert bodies == [b"slow", b"got hi", b"path=/echo q=3"]
        writer.close()

    run(scenario)


def test_chunked_bodies_in_and_out() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await exchange(
            port,
            b"PUT /stream HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
            b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        )
        assert (await read_answer(reader))[2] == b"streamed abcde"
        writer.write(b"GET /chunked HTTP/1.1\r\nHost: x\r\n\r\n")
        _, headers, body = await read_answer(reader)
        assert headers["Transfer-Encoding"] == "chunked" and body == b"one,two"
        writer.write(b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")  # still usable
        assert (await read_answer(reader))[2] == b"path=/echo q="
        writer.close()

    run(scenario)


def test_expect_100_continue() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await exchange(
            port,
            b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n",
        )
        assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 (Continue)\r\n\r\n"
        writer.write(b"body")
        assert (await read_answer(reader))[2] == b"got body"
        writer.close()

    run(scenario)


@pytest.mark.parametrize(
    "sent",
    [
        b"GET /echo HTTP/2.0\r\nHost: x\r\n\r\n",
        b"GET /echo HTTP/1.1\r\nBad Header\r\n\r\n",
        b"GARBAGE\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n",
    ],
    ids=["version", "header", "line", "too-long"],
)
def test_malformed_requests_get_400_and_the_server_serves_on(
    sent: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario(port: int) -> None:
        reader, writer = await exchange(port, sent)
        assert await reader.read() == b"HTTP/1.1 400 Bad Request\r\n\r\n"
        writer.close()
        await serves_a_good_request(port)

    with caplog.at_level(logging.INFO, logger="tornado.general"):
        run(scenario, max_body_size=1000)
    assert "Malformed HTTP message from 127.0.0.1" in caplog.text


def test_oversize_headers_close_without_an_answer() -> None:
    async def scenario(port: int) -> None:
        for sent in (
            b"GET /echo HTTP/1.1\r\nX-Big: " + b"a" * 3000 + b"\r\n\r\n",  # complete
            b"GET /echo HTTP/1.1\r\nX-Big: " + b"a" * 3000,  # still coming
        ):
            reader, writer = await exchange(port, sent)
            assert await reader.read() == b""
            writer.close()
        await serves_a_good_request(port)

    run(scenario, max_header_size=1024)


def test_idle_connections_are_closed() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await exchange(port, b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        await read_answer(reader)
        started = asyncio.get_running_loop().time()
        assert await reader.read() == b""
        assert asyncio.get_running_loop().time() - started < 2
        writer.close()

    run(scenario, idle_timeout_secs=0.3)


def test_a_body_that_stops_coming_is_cut_off(caplog: pytest.LogCaptureFixture) -> None:
    async def scenario(port: int) -> None:
        reader, writer = await exchange(
            port, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc"
        )
        assert await reader.read() == b""
        writer.close()
        await serves_a_good_request(port)

    with caplog.at_level(logging.INFO, logger="tornado.general"):
        run(scenario, body_timeout_secs=0.2)
    assert "Timeout reading body from 127.0.0.1" in caplog.text


def test_a_later_body_that_stops_coming_is_cut_off_at_its_own_deadline() -> None:
    """The body deadline shares the connection's idle timer, set for later than it."""

    async def scenario(port: int) -> None:
        loop = asyncio.get_running_loop()
        reader, writer = await exchange(port, b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
        await read_answer(reader)
        await asyncio.sleep(0.2)
        writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
        started = loop.time()
        assert await reader.read() == b""
        assert 0.25 <= loop.time() - started < 1.5  # its deadline, not the idle timer's
        writer.close()
        await serves_a_good_request(port)

    run(scenario, idle_timeout_secs=3, body_timeout_secs=0.3)


def test_a_slow_body_within_its_deadline_is_served_though_the_idle_timer_fires() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await exchange(
            port, b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 6\r\n\r\nabc"
        )
        await asyncio.sleep(0.4)  # the idle timer fires meanwhile: the connection is busy
        writer.write(b"def")
        assert (await read_answer(reader))[2] == b"got abcdef"
        writer.close()

    run(scenario, idle_timeout_secs=0.2, body_timeout_secs=3)


def test_requests_with_bodies_set_no_timer_each(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under load a timer set and cancelled per request cost 2-3% of a front end's CPU; the
    connection's one timer covers every body's deadline."""
    timers: list[float] = []

    async def main() -> None:
        # asyncio's own loop: uvloop's takes no attribute of ours (what is counted is the
        # same on both)
        loop = asyncio.get_running_loop()
        call_later = loop.call_later

        def counted(delay: float, *args: object) -> asyncio.TimerHandle:
            timers.append(delay)
            return call_later(delay, *args)  # type: ignore[arg-type]

        monkeypatch.setattr(loop, "call_later", counted)
        async with serving(body_timeout_secs=300) as (_, port):
            reader, writer = await exchange(port, b"")
            for index in range(20):
                writer.write(b"POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n")
                writer.write(b"%02d" % index)
                assert (await read_answer(reader))[2] == b"got %02d" % index
            writer.close()

    asyncio.run(main())
    # the connection's idle timer (an hour here), moved once to the first body's deadline
    assert timers == [3600, 300]


def test_an_answer_before_the_body_reaches_a_client_that_sends_it_all_first() -> None:
    """The connection closes only after the client has, having dropped the rest of the body:
    closed with the body unread, the kernel would reset it and the answer be lost."""

    async def scenario(port: int) -> None:
        reader, writer = await exchange(
            port, b"PUT /refuse HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % BIG
        )
        await asyncio.sleep(0.2)  # answered and half-closed by now
        writer.write(b"x" * BIG)
        await writer.drain()
        status, _, body = await read_answer(reader)
        assert (status, body) == ("HTTP/1.1 503 Service Unavailable", b"no room")
        assert await reader.read() == b""
        writer.close()
        await serves_a_good_request(port)

    run(scenario)


def test_an_answer_written_from_a_view_arrives_as_it_was() -> None:
    async def scenario(port: int) -> None:
        reader, writer = await exchange(port, b"GET /views HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.2)  # the kernel's buffers fill; the rest waits in the transport
        _, _, body = await read_answer(reader)
        assert len(body) == BIG and body.count(b"a") == BIG
        writer.close()

    run(scenario)


def test_a_client_gone_while_its_answer_is_made_is_told_to_the_handler() -> None:
    async def scenario(port: int) -> None:
        _Hang.closed = asyncio.Event()
        _, writer = await exchange(port, b"GET /hang HTTP/1.1\r\nHost: x\r\n\r\n")
        await asyncio.sleep(0.1)
        writer.close()
        await asyncio.wait_for(_Hang.closed.wait(), 5)

    run(scenario)


def test_closing_all_connections() -> None:
    async def main() -> None:
        async with serving() as (http, port):
            reader, writer = await exchange(port, b"GET /echo HTTP/1.1\r\nHost: x\r\n\r\n")
            await read_answer(reader)
            assert len(http.connections) == 1
            await asyncio.wait_for(http.close_all_connections(), 5)
            assert not http.connections
            assert await reader.read() == b""
            writer.close()

    event_loop.run(main())


def test_a_closed_connection_is_freed_without_the_collector() -> None:
    """Nothing refers back to a lost connection (its parser, transport or idle timer), so its
    reference count frees it and its read buffer at once."""

    async def main() -> None:
        async with serving() as (http, port):
            with collector_off():
                before = alive(HttpConnection)
                for _ in range(10):
                    reader, writer = await exchange(
                        port, b"GET /echo HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
                    )
                    assert (await read_answer(reader))[2] == b"path=/echo q="
                    assert await reader.read() == b""
                    writer.close()
                    await writer.wait_closed()
                await until_empty(http.connections)
                assert alive(HttpConnection) == before

    event_loop.run(main())
