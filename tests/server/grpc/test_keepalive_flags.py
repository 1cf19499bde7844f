"""tritonserver's gRPC keepalive flags change what the server does on a connection: seen from
a raw HTTP/2 client (``tests.server.grpc.raw_http2``) of a real server."""

from __future__ import annotations

import struct
import time

from h2.errors import ErrorCodes
from h2.exceptions import ProtocolError

from tests.server.grpc.raw_http2 import RawHttp2Client
from tests.server_process import EXAMPLES, start_server


def _flood(client: RawHttp2Client, pings: int = 100) -> None:
    for count in range(pings):
        client.h2.ping(struct.pack(">Q", count))
    client.flush()


def _wait_for_goaway(client: RawHttp2Client, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while client.goaway is None and not client.closed and time.monotonic() < deadline:
        try:
            client.receive(0.1)
        except ProtocolError:  # h2 refuses frames after a GOAWAY (grpc core pings after it)
            assert client.goaway is not None


def test_no_ping_strike_limit_accepts_a_ping_flood() -> None:
    """``--grpc-http2-max-ping-strikes=0``: the flood that closes a connection by default
    (``test_http2_abuse``) is answered, the connection kept."""
    server = start_server(EXAMPLES, args=("--grpc-http2-max-ping-strikes=0",))
    try:
        assert server.grpc_port is not None, server.log
        client = RawHttp2Client(server.grpc_port)
        try:
            _flood(client)
            _wait_for_goaway(client, 2.0)
            assert client.goaway is None and not client.closed
        finally:
            client.close()
    finally:
        assert server.stop() == 0


def test_max_connection_age_sends_goaway() -> None:
    """``--grpc-max-connection-age``: an old connection is asked to go (GOAWAY, no error)."""
    server = start_server(
        EXAMPLES, args=("--grpc-max-connection-age=300", "--grpc-max-connection-age-grace=300")
    )
    try:
        assert server.grpc_port is not None, server.log
        client = RawHttp2Client(server.grpc_port)
        started = time.monotonic()
        try:
            _wait_for_goaway(client, 10.0)
            assert client.goaway is not None, client.closed
            assert client.goaway.error_code == ErrorCodes.NO_ERROR
            assert time.monotonic() - started >= 0.2  # the age, less grpc core's jitter
        finally:
            client.close()
    finally:
        assert server.stop() == 0
