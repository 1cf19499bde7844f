"""HTTP/2 abuse on one connection leaves every other client served: rapid reset (20,000
HEADERS + DATA + RST_STREAM, CVE-2023-44487) costs the server a header decode per stream and
no handler (streams past the limit, which count until their handlers end, are refused:
``test_connection``), a ping flood closes that connection; the server announces its stream
limit. The abusive client is raw HTTP/2 (``tests.server.grpc.raw_http2``) on 127.0.0.1."""

from __future__ import annotations

import struct
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Self

import grpc
import numpy as np
import pytest
from h2.errors import ErrorCodes
from h2.settings import SettingCodes

from server.generated import grpc_service_pb2 as pb
from server.generated import grpc_service_pb2_grpc as pb_grpc
from server.grpc.connection import MAX_CONCURRENT_STREAMS
from tests.server.grpc.raw_http2 import RawHttp2Client
from tests.server_process import EXAMPLES, ServerProcess, start_server

PAIRS = 20_000
ATTACK_SECONDS = 15.0  # the attack stops at PAIRS or after this long, whichever comes first
#: Pairs sent at once: more than the stream limit, so that a server that frees streams quickly
#: still sees more of them at once than it allows.
BURST = 2 * MAX_CONCURRENT_STREAMS
NORMAL_CALLERS = 4

SIMPLE = pb.ModelInferRequest(
    model_name="simple",
    id="normal",
    inputs=[
        pb.ModelInferRequest.InferInputTensor(name=name, datatype="INT32", shape=[1, 16])
        for name in ("INPUT0", "INPUT1")
    ],
    raw_input_contents=[np.arange(16, dtype=np.int32).tobytes(), np.ones(16, np.int32).tobytes()],
)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    process = start_server(EXAMPLES)
    assert process.grpc_port is not None, process.log
    yield process
    process.stop()


def _call_headers(port: int, method: str) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", f"/inference.GRPCInferenceService/{method}"),
        (":authority", f"127.0.0.1:{port}"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


def _assert_simple(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    reply = stub.ModelInfer(SIMPLE, timeout=10)
    assert np.frombuffer(reply.raw_output_contents[0], np.int32).tolist() == list(range(1, 17))


class NormalClient:
    """``NORMAL_CALLERS`` threads calling ModelInfer on one channel until stopped."""

    def __init__(self, server: ServerProcess) -> None:
        self.channel = grpc.insecure_channel(server.grpc_url)
        self.stub = pb_grpc.GRPCInferenceServiceStub(self.channel)
        self.ok = 0
        self.failures: Counter[str] = Counter()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._threads = [threading.Thread(target=self._call) for _ in range(NORMAL_CALLERS)]

    def __enter__(self) -> Self:
        _assert_simple(self.stub)  # connected before the attack starts
        for thread in self._threads:
            thread.start()
        return self

    def _call(self) -> None:
        while not self._stop.is_set():
            try:
                _assert_simple(self.stub)
            except grpc.RpcError as error:
                with self._lock:
                    self.failures[f"{error.code().name}: {error.details()}"] += 1
            else:
                with self._lock:
                    self.ok += 1

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(30)
        self.channel.close()


def test_server_announces_its_stream_limit(server: ServerProcess) -> None:
    client = RawHttp2Client(server.grpc_port or 0)
    try:
        deadline = time.monotonic() + 5
        while not client.settings and time.monotonic() < deadline:
            client.receive(0.1)
        assert client.settings.get(SettingCodes.MAX_CONCURRENT_STREAMS) == MAX_CONCURRENT_STREAMS
    finally:
        client.close()


def test_rapid_reset_leaves_other_connections_served(server: ServerProcess) -> None:
    """While one connection opens and resets 20,000 streams, every ModelInfer call of another
    connection succeeds, and the attacker's connection stays usable."""
    port = server.grpc_port or 0
    body = SIMPLE.SerializeToString()
    message = b"\x00" + struct.pack(">I", len(body)) + body  # one gRPC length-prefixed message
    headers = _call_headers(port, "ModelInfer")
    with NormalClient(server) as normal:
        attacker = RawHttp2Client(port)
        try:
            deadline = time.monotonic() + ATTACK_SECONDS
            for pair in range(PAIRS):
                stream = attacker.h2.get_next_available_stream_id()
                attacker.h2.send_headers(stream, headers)
                if attacker.h2.local_flow_control_window(stream) >= len(message):
                    attacker.h2.send_data(stream, message)
                attacker.h2.reset_stream(stream, ErrorCodes.CANCEL)
                if pair % BURST == BURST - 1:
                    attacker.flush()
                    attacker.receive()
                    if attacker.closed or time.monotonic() > deadline:
                        break
            attacker.flush()
            attacker.receive(1.0)
        finally:
            attacker.close()
        sent = pair + 1
    assert normal.failures == Counter(), (normal.failures, normal.ok)
    assert normal.ok > 0
    assert attacker.goaway is None and sent > BURST, (sent, attacker.goaway)
    with grpc.insecure_channel(server.grpc_url) as channel:
        _assert_simple(pb_grpc.GRPCInferenceServiceStub(channel))


def test_ping_flood_closes_that_connection_only(server: ServerProcess) -> None:
    """Pings without data past the strikes: GOAWAY ENHANCE_YOUR_CALM "too_many_pings" on that
    connection; other connections are served."""
    with NormalClient(server) as normal:
        flooder = RawHttp2Client(server.grpc_port or 0)
        try:
            for count in range(100):
                flooder.h2.ping(struct.pack(">Q", count))
            flooder.flush()
            deadline = time.monotonic() + 5
            while flooder.goaway is None and not flooder.closed and time.monotonic() < deadline:
                flooder.receive(0.1)
        finally:
            flooder.close()
    assert flooder.goaway is not None
    assert flooder.goaway.error_code == ErrorCodes.ENHANCE_YOUR_CALM
    assert flooder.goaway.additional_data == b"too_many_pings"
    assert normal.failures == Counter() and normal.ok > 0, (normal.failures, normal.ok)
