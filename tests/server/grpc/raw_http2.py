"""A raw HTTP/2 client for the gRPC port's tests: one plain connection to 127.0.0.1, driven frame
by frame.

The ``h2`` library keeps the connection's state (SETTINGS and PING acknowledgements, HPACK,
stream ids, the windows it gives back as data is read); the frames the server sends are also
parsed here, because h2 hides those of streams it considers closed (a RST_STREAM that refuses
a stream the client has reset).
"""

from __future__ import annotations

import collections
import selectors
import socket
import struct
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
from hyperframe.frame import Frame, GoAwayFrame, RstStreamFrame, SettingsFrame

_HEADER = 9  # bytes of an HTTP/2 frame header


@dataclass
class Response:
    """What the server sent on one stream."""

    headers: dict[str, str] = field(default_factory=dict)
    data: bytearray = field(default_factory=bytearray)
    trailers: dict[str, str] = field(default_factory=dict)
    reset: int | None = None  # RST_STREAM's error code
    ended: bool = False

    @property
    def status(self) -> int | None:
        """grpc-status, from the trailers (or from a trailers-only response's headers)."""
        text = self.trailers.get("grpc-status", self.headers.get("grpc-status"))
        return None if text is None else int(text)

    @property
    def message(self) -> str:
        return self.trailers.get("grpc-message", self.headers.get("grpc-message", ""))

    def messages(self) -> list[bytes]:
        """The gRPC messages of the data (length-prefixed)."""
        out, pos = [], 0
        while pos + 5 <= len(self.data):
            (length,) = struct.unpack_from(">I", self.data, pos + 1)
            out.append(bytes(self.data[pos + 5 : pos + 5 + length]))
            pos += 5 + length
        return out


def grpc_message(payload: bytes, compressed: bool = False) -> bytes:
    """One length-prefixed gRPC message."""
    return bytes([int(compressed)]) + struct.pack(">I", len(payload)) + payload


def call_headers(port: int, path: str, *extra: tuple[str, str]) -> list[tuple[str, str]]:
    return [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", f"127.0.0.1:{port}"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        *extra,
    ]


class RawHttp2Client:
    """What the server sent so far: ``settings`` (from its SETTINGS frames), ``resets``
    (RST_STREAM error code -> count), ``goaway`` (its GOAWAY frame, if any) and ``responses``
    (stream id -> ``Response``)."""

    def __init__(self, port: int, config: h2.config.H2Configuration | None = None) -> None:
        self.port = port
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setblocking(False)
        self.h2 = h2.connection.H2Connection(
            config or h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.settings: dict[int, int] = {}
        self.resets: collections.Counter[int] = collections.Counter()
        self.goaway: GoAwayFrame | None = None
        self.responses: dict[int, Response] = collections.defaultdict(Response)
        self.pings_acked = 0
        self.closed = False
        self.acknowledge = True  # give back the windows of the data read
        self._buffer = bytearray()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.sock, selectors.EVENT_READ)
        self.h2.initiate_connection()
        self.flush()

    def flush(self) -> None:
        """Send everything h2 has queued (blocking until the socket took it)."""
        self.send_raw(self.h2.data_to_send())

    def send_raw(self, data: bytes) -> None:
        if data and not self.closed:
            self.sock.setblocking(True)
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = True
            finally:
                self.sock.setblocking(False)

    def receive(self, seconds: float = 0.0) -> None:
        """Read what the server sends for up to ``seconds`` (0: what has already arrived)."""
        deadline = time.monotonic() + seconds
        while not self.closed:
            if not self._selector.select(max(0.0, deadline - time.monotonic())):
                return
            try:
                data = self.sock.recv(1 << 20)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if not data:
                self.closed = True
                return
            self._parse(data)
            self._events(self.h2.receive_data(data))
            self.flush()  # the acknowledgements h2 owes

    def wait(self, condition: Callable[[], bool], seconds: float = 5.0) -> None:
        """Read until ``condition()`` holds (or ``seconds`` have passed, or the server closed)."""
        deadline = time.monotonic() + seconds
        while not condition() and not self.closed and time.monotonic() < deadline:
            self.receive(0.05)

    def call(self, path: str, payload: bytes, *extra: tuple[str, str]) -> Response:
        """A unary call: HEADERS, one message with END_STREAM; its response once it ends."""
        stream = self.start(path, *extra)
        self.h2.send_data(stream, grpc_message(payload), end_stream=True)
        self.flush()
        return self.finish(stream)

    def start(self, path: str, *extra: tuple[str, str]) -> int:
        stream = self.h2.get_next_available_stream_id()
        self.h2.send_headers(stream, call_headers(self.port, path, *extra))
        self.flush()
        return stream

    def finish(self, stream: int, seconds: float = 5.0) -> Response:
        response = self.responses[stream]
        self.wait(lambda: response.ended, seconds)
        return response

    def _events(self, events: list[h2.events.Event]) -> None:
        for event in events:
            if isinstance(event, h2.events.ResponseReceived):
                self.responses[event.stream_id].headers.update(_text(event.headers))
            elif isinstance(event, h2.events.TrailersReceived):
                self.responses[event.stream_id].trailers.update(_text(event.headers))
            elif isinstance(event, h2.events.DataReceived):
                self.responses[event.stream_id].data += event.data
                if self.acknowledge:
                    self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                self.responses[event.stream_id].ended = True
            elif isinstance(event, h2.events.StreamReset):
                response = self.responses[event.stream_id]
                response.reset, response.ended = event.error_code, True
            elif isinstance(event, h2.events.PingAckReceived):
                self.pings_acked += 1

    def _parse(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= _HEADER:
            frame, length = Frame.parse_frame_header(memoryview(bytes(self._buffer[:_HEADER])))
            if len(self._buffer) < _HEADER + length:
                return
            frame.parse_body(memoryview(bytes(self._buffer[_HEADER : _HEADER + length])))
            del self._buffer[: _HEADER + length]
            if isinstance(frame, SettingsFrame) and "ACK" not in frame.flags:
                self.settings.update(frame.settings)
            elif isinstance(frame, RstStreamFrame):
                self.resets[frame.error_code] += 1
            elif isinstance(frame, GoAwayFrame):
                self.goaway = frame

    def close(self) -> None:
        self._selector.close()
        self.sock.close()


def _text(headers: Iterable[tuple[str | bytes, str | bytes]]) -> dict[str, str]:
    return {
        (k if isinstance(k, str) else k.decode()): (v if isinstance(v, str) else v.decode())
        for k, v in headers
    }

