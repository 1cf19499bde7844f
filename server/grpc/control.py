"""The control frames of a gRPC connection (RST_STREAM, WINDOW_UPDATE, SETTINGS, PING), the
connection's errors, and its timers (keepalive pings, its age): the layer between
``server.grpc.streams`` and ``server.grpc.connection``, which reads the frames.
"""

from __future__ import annotations

import asyncio
import logging
import time

from server.grpc import frames, headers, keepalive
from server.grpc.frames import ErrorCode, Setting
from server.grpc.streams import Http2Streams
from server.settings import GrpcKeepalive

log = logging.getLogger("server.grpc")


class ConnectionError_(Exception):
    """Ends the connection with GOAWAY ``code``."""

    def __init__(self, code: ErrorCode, debug: str) -> None:
        super().__init__(debug)
        self.code = code
        self.debug = debug


class Http2Control(Http2Streams):
    """Control frames, connection errors and timers of one connection."""

    def __init__(self, keepalive_flags: GrpcKeepalive, peer: str) -> None:
        super().__init__(keepalive_flags)
        self.peer = peer
        self._keepalive_flags = keepalive_flags
        self._settings_seen = False  # the client's first SETTINGS frame has come
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._ping_sent = False

    def _start_timers(self) -> None:
        self._schedule_keepalive()
        age = keepalive.connection_age_s(self._keepalive_flags)
        if age is not None:
            self._timers["age"] = self.loop.call_later(age, self._too_old)

    def _stop_timers(self) -> None:
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    # --- frames ----------------------------------------------------------------------------

    def _rst_stream_frame(self, stream: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        if stream == 0 or stream > self._last_stream:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"RST_STREAM on stream {stream}")
        self._drop(stream)

    def _window_update_frame(self, stream: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = frames.read_u32(payload) & 0x7FFFFFFF
        if stream == 0:
            if increment == 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "a WINDOW_UPDATE of 0")
            self._send_window += increment
            if self._send_window > frames.LARGEST_WINDOW:
                raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "the window overflowed")
            self._flush_blocked()
            return
        if stream > self._last_stream:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle {stream}")
        call = self._streams.get(stream)
        if call is None or call.local_closed:
            return
        if increment == 0:
            self._reset(stream, ErrorCode.PROTOCOL_ERROR)
            return
        call.send_window += increment
        if call.send_window > frames.LARGEST_WINDOW:
            self._reset(stream, ErrorCode.FLOW_CONTROL_ERROR)
            return
        self._flush(call)

    def _settings_frame(self, flags: int, stream: int, payload: memoryview) -> None:
        if stream:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & frames.ACK:
            if payload:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS of the wrong size")
        self._settings_seen = True
        for key, value in frames.read_settings(payload):
            if key == Setting.INITIAL_WINDOW_SIZE:
                if value > frames.LARGEST_WINDOW:
                    raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "initial window too large")
                delta, self._peer_initial_window = value - self._peer_initial_window, value
                for call in self._streams.values():
                    call.send_window += delta
                    if call.send_window > frames.LARGEST_WINDOW:
                        raise ConnectionError_(
                            ErrorCode.FLOW_CONTROL_ERROR, "a stream window overflowed"
                        )
            elif key == Setting.MAX_FRAME_SIZE:
                if not frames.DEFAULT_MAX_FRAME_SIZE <= value <= frames.LARGEST_FRAME_SIZE:
                    raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "invalid max frame size")
                self._peer_max_frame = value
            elif key == Setting.ENABLE_PUSH and value > 1:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "invalid ENABLE_PUSH")
            elif key == Setting.HEADER_TABLE_SIZE and value < self._table_size:
                # Our blocks use no dynamic table; the client's decoder is still told its
                # new size is ours (RFC 7541 section 4.2).
                self._table_size = value
                self._table_update = headers.table_size_update(value)
        self._write(frames.SETTINGS_ACK)
        for call in list(self._streams.values()):  # a larger initial window may free any
            if not call.local_closed and (call.outgoing or call.trailers is not None):
                self._flush(call)

    def _ping_frame(self, flags: int, stream: int, payload: memoryview) -> None:
        if stream:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, "PING of the wrong size")
        if flags & frames.ACK:
            self._ping_sent = False
            timer = self._timers.pop("ping timeout", None)
            if timer is not None:
                timer.cancel()
            return
        self._write(frames.ping(payload.tobytes(), ack=True))
        if self._pings.too_many(time.monotonic(), not self._streams):
            raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "too_many_pings")

    # --- errors ----------------------------------------------------------------------------

    def reset(self, stream: int) -> None:
        """Cancel a stream whose call has ended but cannot say so (RST_STREAM CANCEL)."""
        self._reset(stream, ErrorCode.CANCEL)

    def _reset(self, stream: int, code: ErrorCode) -> None:
        """Reset a stream (a stream error)."""
        self._write(frames.rst_stream(stream, code))
        self._drop(stream)

    def _fail(self, code: ErrorCode, debug: str) -> None:
        """A connection error: GOAWAY, and the connection closed."""
        log.debug("closing a gRPC connection from %s: %s (%s)", self.peer, code.name, debug)
        self._write(frames.goaway(self._last_stream, code, debug.encode("utf-8")[:200]))
        self._goaway = self._last_stream
        self.close()

    # --- timers ----------------------------------------------------------------------------

    def _too_old(self) -> None:
        self._timers.pop("age", None)
        self.go_away()
        grace = keepalive.connection_age_grace_s(self._keepalive_flags)
        if grace is not None:
            self._timers["grace"] = self.loop.call_later(grace, self.close, True)

    def _schedule_keepalive(self) -> None:
        self._timers["keepalive"] = self.loop.call_later(
            self._keepalive.interval_s, self._keepalive_due
        )

    def _keepalive_due(self) -> None:
        if not self._ping_sent and self._keepalive.may_ping(not self._streams):
            self._ping_sent = True
            self._write(frames.ping(b"\x00" * 8, ack=False))
            self._timers["ping timeout"] = self.loop.call_later(
                self._keepalive.timeout_s, self._keepalive_lost
            )
        self._schedule_keepalive()

    def _keepalive_lost(self) -> None:
        log.debug("closing a gRPC connection from %s: keepalive ping unanswered", self.peer)
        self._timers.pop("ping timeout", None)
        self.close(at_once=True)  # (a client that answers no ping reads nothing either)
