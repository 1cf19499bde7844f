"""The asyncio HTTP closed loop against a scripted local server: counts, errors, reconnects,
the request cap, and a server that never answers. And how slots are shared among workers."""

from __future__ import annotations

import asyncio
import re

import pytest

from server.loadtest import clients
from server.loadtest.clients import HttpFraming, HttpLoadGenerator
from server.loadtest.measurements import Sample
from server.loadtest.workers import split

REQUEST = b"POST /v2/models/m/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello"
_LENGTH = re.compile(rb"content-length: (\d+)", re.IGNORECASE)


class ScriptedServer:
    """Answers 200 with a body, except: request numbers in ``fail`` get a 500, those in
    ``drop`` get the connection closed unanswered; ``silent`` answers nothing at all."""

    def __init__(
        self,
        fail: frozenset[int] = frozenset(),
        drop: frozenset[int] = frozenset(),
        silent: bool = False,
    ) -> None:
        self.fail, self.drop, self.silent = fail, drop, silent
        self.received = 0
        self.connections = 0
        self.server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> tuple[str, int]:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return "127.0.0.1", self.server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        assert self.server is not None
        self.server.close()
        for writer in self._writers:
            writer.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                match = _LENGTH.search(head)
                assert match is not None
                await reader.readexactly(int(match.group(1)))
                self.received += 1
                if self.silent:
                    continue
                if self.received in self.drop:
                    writer.close()
                    return
                status, body = (
                    ("500 Internal Server Error", b'{"error":"scripted failure"}')
                    if self.received in self.fail
                    else ("200 OK", b'{"outputs":[]}')
                )
                writer.write(
                    f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
                )
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()


async def _run(server: ScriptedServer, concurrency: int, seconds: float, cap: int) -> Sample:
    address = await server.start()
    generator = HttpLoadGenerator(address, REQUEST, concurrency)
    try:
        await generator.connect()
        return await generator.run_for(seconds, cap, Sample())
    finally:
        await generator.close()
        await server.stop()


def test_framing() -> None:
    framing = HttpFraming()
    response = bytearray(b"HTTP/1.1 200 OK\r\ncontent-LENGTH: 3\r\n\r\nabc")
    assert framing.response_length(response, 10) is None
    assert framing.response_length(response, len(response)) == len(response)
    assert framing.ok(memoryview(response))
    with pytest.raises(ConnectionError):
        framing.response_length(bytearray(b"HTTP/1.1 200 OK\r\n\r\n"), 19)


def test_cap_errors_and_reconnect() -> None:
    server = ScriptedServer(fail=frozenset({5}), drop=frozenset({9}))
    sample = asyncio.run(_run(server, concurrency=3, seconds=30, cap=40))
    assert server.received == 40  # the cap, not the 30 s, ended the run
    assert sample.requests == 38 and len(sample.latencies) == 38
    assert sample.errors == 2
    assert '500 Internal Server Error: {"error":"scripted failure"}' in sample.first_error
    assert server.connections == 4  # three slots, one replaced after the drop
    assert sample.first_response.startswith(b"HTTP/1.1 200 OK")
    assert sample.elapsed < 10 and 0 < sample.client_cpu


def test_time_bound_run_keeps_every_slot_busy() -> None:
    server = ScriptedServer()
    sample = asyncio.run(_run(server, concurrency=4, seconds=0.3, cap=10**9))
    assert sample.errors == 0
    assert sample.requests == server.received > 20
    assert 0.3 <= sample.elapsed < 5
    assert all(latency < sample.elapsed for latency in sample.latencies)


def test_a_server_that_never_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(clients, "STALL_S", 0.3)
    server = ScriptedServer(silent=True)
    sample = asyncio.run(_run(server, concurrency=2, seconds=0.1, cap=100))
    assert (sample.requests, sample.errors) == (0, 2)
    assert sample.first_error.startswith("no response within")


def test_split() -> None:
    assert split(8, 3) == [3, 3, 2]
    assert split(2, 4) == [1, 1, 0, 0]
    assert split(5, 1) == [5]
    assert sum(split(1001, 7)) == 1001
