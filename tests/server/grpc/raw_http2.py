"""A raw HTTP/2 client for abuse tests: one plain connection to 127.0.0.1, driven frame by frame.

The ``h2`` library keeps the connection's state (SETTINGS and PING acknowledgements, HPACK,
stream ids); the frames the server sends are also parsed here, because h2 hides those of
streams it considers closed (a RST_STREAM that refuses a stream the client has reset).
"""

from __future__ import annotations

import collections
import selectors
import socket
import time

import h2.config
import h2.connection
from hyperframe.frame import Frame, GoAwayFrame, RstStreamFrame, SettingsFrame

_HEADER = 9  # bytes of an HTTP/2 frame header


class RawHttp2Client:
    """What the server sent so far: ``settings`` (from its SETTINGS frames), ``resets``
    (RST_STREAM error code -> count) and ``goaway`` (its GOAWAY frame, if any)."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.sock.setblocking(False)
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.settings: dict[int, int] = {}
        self.resets: collections.Counter[int] = collections.Counter()
        self.goaway: GoAwayFrame | None = None
        self.closed = False
        self._buffer = bytearray()
        self._selector = selectors.DefaultSelector()
        self._selector.register(self.sock, selectors.EVENT_READ)
        self.h2.initiate_connection()
        self.flush()

    def flush(self) -> None:
        """Send everything h2 has queued (blocking until the socket took it)."""
        data = self.h2.data_to_send()
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
            self.h2.receive_data(data)
            self.flush()  # the acknowledgements h2 owes

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
