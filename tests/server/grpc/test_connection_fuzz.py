"""Property-based fuzzing of the gRPC port's frame reader (``server.grpc.connection``): after a
valid preface, any sequence of frames -- of every type, with any flags, stream ids, lengths
and payloads, split into reads anywhere -- is handled: the connection answers, resets
streams or closes with GOAWAY, and never lets an exception out of ``buffer_updated`` (which
would be a bug closing the connection without a word), and no handler's task fails."""

from __future__ import annotations

import asyncio
import struct
from typing import Any

import hpack
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server import event_loop
from server.grpc import frames
from server.grpc.call import CallContext, Method
from server.grpc.connection import GrpcService, Http2Connection
from server.settings import GrpcKeepalive
from tests.server.grpc.fakes import FakeTransport

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


async def _echo(request: bytes, context: CallContext) -> bytes:
    await asyncio.sleep(0)
    return request


async def _stream(requests: Any, context: CallContext) -> Any:
    async for request in requests:
        yield request


METHODS = {
    "/t/echo": Method(_echo),
    "/t/stream": Method(_stream, request_streaming=True, response_streaming=True),
}
_HEADERS = [
    (":method", "POST"), (":scheme", "http"), (":authority", "x"),
    ("content-type", "application/grpc"),
]


def _block(path: str, extra: list[tuple[str, str]]) -> bytes:
    return hpack.Encoder().encode([*_HEADERS, (":path", path), *extra])


header_blocks = st.one_of(
    st.builds(
        _block,
        st.sampled_from(["/t/echo", "/t/stream", "/t/none", ""]),
        st.lists(
            st.tuples(
                st.sampled_from(["grpc-timeout", "grpc-encoding", "x-a", "x-b-bin", "te"]),
                st.sampled_from(["1m", "gzip", "deflate", "v", "AAE", "99999999S", ""]),
            ),
            max_size=3,
        ),
    ),
    st.binary(max_size=40),
)


def _message(payload: bytes, flag: int) -> bytes:
    return bytes([flag]) + struct.pack(">I", len(payload)) + payload


payloads = st.one_of(
    st.binary(max_size=64),
    st.builds(_message, st.binary(max_size=48), st.sampled_from([0, 0, 1, 2])),
    header_blocks,
    st.builds(struct.pack, st.just(">I"), st.integers(0, 2**32 - 1)),
    st.builds(struct.pack, st.just(">HI"), st.integers(0, 8), st.integers(0, 2**32 - 1)),
)
frame_list = st.lists(
    st.tuples(
        st.sampled_from(range(11)),  # every type, and an unknown one
        st.sampled_from([0, 1, 4, 5, 8, 0x20, 0x2D, 0xFF]),
        st.sampled_from([0, 1, 2, 3, 5, 7, 2**31 - 1]),
        payloads,
    ),
    max_size=12,
)


def _wire(items: list[tuple[int, int, int, bytes]]) -> bytes:
    out = bytearray(frames.PREFACE + frames.settings({}))
    for kind, flags, stream, payload in items:
        out += frames.frame(kind, flags, stream, payload)
    return bytes(out)


def _feed(connection: Http2Connection, data: bytes, cuts: list[int]) -> None:
    positions = sorted({min(cut, len(data)) for cut in cuts} | {len(data)})
    start = 0
    for end in positions:
        while start < end:
            buffer = connection.get_buffer(-1)
            size = min(len(buffer), end - start)
            buffer[:size] = data[start : start + size]
            connection.buffer_updated(size)
            start += size


@FUZZ
@given(frame_list, st.lists(st.integers(0, 2000), max_size=6))
def test_any_frames_are_handled(items: list[tuple[int, int, int, bytes]], cuts: list[int]) -> None:
    errors: list[dict[str, Any]] = []

    async def main() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda _, context: errors.append(context))
        service = GrpcService(METHODS, GrpcKeepalive())
        connection = Http2Connection(service, ("127.0.0.1", 1))
        transport = FakeTransport()
        connection.connection_made(transport)  # type: ignore[arg-type]
        _feed(connection, _wire(items), cuts)
        for _ in range(3):  # let handlers run and answer
            await asyncio.sleep(0)
        connection.connection_lost(None)
        for _ in range(3):  # the handlers cancelled end
            await asyncio.sleep(0)
        assert transport.written.startswith(frames.header(frames.SETTINGS, 0, 0, 24))

    event_loop.run(main())
    assert errors == []  # no task failed, no callback raised
