"""gRPC's HTTP/2 (RFC 9113) on the event loop: one protocol object per client connection.

Why not grpcio's server: under perf_analyzer (simple, gRPC, concurrency 8, one process) grpc.aio
cost 275-305 µs of CPU per call, against 112 µs for the same request over HTTP/1.1, and 140 µs
with a canned answer and no work of ours: grpc core reads and writes the socket on its own
threads and hands every completion to the loop through a poller thread, and each of those
hand-overs is a thread wake-up (``perf``: 39 % of the process in the kernel, mostly task
switches). The ``h2`` library on the loop cost 90 µs per call in frame objects and its state
machine. Here frames are read from one buffer with ``struct``, header blocks decoded by
``hpack`` (cached per connection, see ``server.grpc.headers``) and written as constant bytes,
and a unary call is answered with one write of its HEADERS, DATA and trailers.

What the connection does, as grpc core does on a server:

- SETTINGS: the server announces its stream limit (``MAX_CONCURRENT_STREAMS``), windows and
  frame size; the client's are acknowledged and applied (window and frame size, HPACK table).
- Flow control: the client's connection window is given back as bytes arrive; a stream's as
  its handler takes them (``Call.holds_unread``). Responses wait for the client's windows;
  ``Call.send`` returns once the whole message is written.
- A stream past ``MAX_CONCURRENT_STREAMS`` is refused (RST_STREAM REFUSED_STREAM). A stream
  counts until its handler has ended, also after the client reset it, so that opening and
  resetting streams quickly (HTTP/2 rapid reset, CVE-2023-44487) is refused past the limit.
- Pings and the connection's age: ``server.grpc.keepalive``.
- A malformed frame closes the connection with GOAWAY and the error code; a malformed stream
  is reset.

The layers: ``server.grpc.streams`` (the streams and what the server sends),
``server.grpc.control`` (control frames, errors, timers), and this module (reading frames,
HEADERS starting calls, DATA feeding them).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from typing import Any, cast

from server.errors import InferenceServerError
from server.grpc import frames, headers
from server.grpc.call import Call, CallError, Method
from server.grpc.control import ConnectionError_, Http2Control
from server.grpc.frames import ErrorCode, Setting
from server.grpc.headers import HeaderError, RequestHead, RequestHeaderDecoder
from server.grpc.status import StatusCode, status_code
from server.listener import Adopter
from server.memory.host_pool import BufferSource
from server.settings import GrpcKeepalive

#: Streams one connection may have at once (Triton sets no limit; grpc core's default is
#: unlimited). grpc clients wait for a free stream instead of opening more.
MAX_CONCURRENT_STREAMS = 1000
#: The window each stream gives the client, and the connection's.
STREAM_WINDOW = 1 << 20
CONNECTION_WINDOW = 1 << 24
#: The largest frame the client may send (DATA frames are read as they come, whatever their
#: size; other frames are read whole).
MAX_FRAME_SIZE = 1 << 20
#: The largest header list, decoded, and header block, encoded, a call may send.
MAX_HEADER_LIST_SIZE = 1 << 16
_MAX_HEADER_BLOCK = 1 << 16
#: The size of each read, and the buffer it lands in.
_READ_BYTES = 1 << 16
#: A pooled message with at least this much of a DATA frame still to come is read straight
#: into its buffer.
_DIRECT_BYTES = 1 << 14
_END_HEADERS = frames.END_HEADERS
_END_STREAM = frames.END_STREAM


class GrpcService:
    """What the connections of one gRPC port share: the methods, the limits, the refusals of
    ``--grpc-restricted-protocol``, and the set of open connections."""

    def __init__(
        self,
        methods: Mapping[str, Method],
        keepalive: GrpcKeepalive,
        refusal: Callable[[Method, RequestHead], InferenceServerError | None] | None = None,
        max_message_size: int = (1 << 31) - 1,
        buffers: BufferSource | None = None,
        requests_held: Callable[[], AbstractContextManager[None]] = contextlib.nullcontext,
    ) -> None:
        """``buffers``: where large unary requests of raw methods are received (the front
        end's arena; the host pool in one process); None: in memory of their own.
        ``requests_held`` wraps the parsing of each read (``Plane.requests_held``)."""
        self.methods = methods
        self.requests_held = requests_held
        self.buffers = buffers
        self.keepalive = keepalive
        self.refusal = refusal
        self.max_message_size = max_message_size
        self.ssl: ssl.SSLContext | None = None  # TLS for every connection when set
        self.connections: set[Http2Connection] = set()
        self._adopter = Adopter("gRPC")

    def adopt(self, sock: socket.socket, address: Any) -> None:
        """Serve the accepted connection ``sock``."""
        self._adopter.adopt(sock, lambda: Http2Connection(self, address), self.ssl)


class Http2Connection(Http2Control):
    """One client's connection: its frames, streams (``Call``) and windows."""

    def __init__(self, service: GrpcService, address: Any) -> None:
        super().__init__(service.keepalive, _peer(address))
        self.service = service
        self._buffer = bytearray(_READ_BYTES)
        self._view = memoryview(self._buffer)
        self._start = 0  # unparsed bytes are _buffer[_start:_end]
        self._end = 0
        self._preface = True  # the client's preface is still to come
        self._decoder = RequestHeaderDecoder()
        # A header block still taking CONTINUATION frames: stream, END_STREAM, its bytes.
        self._continuation: tuple[int, bool, bytearray] | None = None
        # The DATA frame whose payload is being read: stream (its call, None to drop the
        # bytes), bytes still to come, and END_STREAM.
        self._data_call: Call | None = None
        self._data_left = 0
        self._data_end = False
        # The call whose pooled message the last read went straight into (get_buffer).
        self._direct: Call | None = None
        # What the client may still send on the connection, and what it has sent that its
        # window has not been given back for.
        self._recv_window = CONNECTION_WINDOW
        self._recv_unacked = 0
        self.closed: asyncio.Future[None] = self.loop.create_future()

    # --- the transport --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not subclasses of asyncio.Transport, but are ones.
        self._transport = cast(asyncio.Transport, transport)
        # Told when its buffer empties: releases of written views wait for that (streams).
        self._transport.set_write_buffer_limits(high=0)
        self.service.connections.add(self)
        self._write(
            frames.settings(
                {
                    Setting.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
                    Setting.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
                    Setting.MAX_FRAME_SIZE: MAX_FRAME_SIZE,
                    Setting.MAX_HEADER_LIST_SIZE: MAX_HEADER_LIST_SIZE,
                }
            )
            + frames.window_update(0, CONNECTION_WINDOW - frames.DEFAULT_WINDOW)
        )
        self._start_timers()

    def connection_lost(self, exc: Exception | None) -> None:
        self.service.connections.discard(self)
        self._stop_timers()
        self._cancel_calls()
        self._streams.clear()
        self._blocked.clear()
        self._batch = None  # nothing more is written
        self._release_unsettled()  # the transport holds nothing any more
        if not self.closed.done():
            self.closed.set_result(None)

    # --- reading --------------------------------------------------------------------------

    def get_buffer(self, sizehint: int) -> memoryview:
        # Not every buffer handed out is filled (a read that would block, a partial TLS
        # record): what the last one was is decided afresh each time.
        self._direct = None
        call = self._data_call
        if call is not None and self._data_left >= _DIRECT_BYTES and self._start == self._end:
            space = call.pooled_space
            if space is not None and len(space) >= _DIRECT_BYTES:
                # Nothing unparsed before it: the rest of this DATA frame goes straight where
                # the message belongs (one copy, the kernel's, from the socket to the pool).
                self._direct = call
                return space[: self._data_left]
        if len(self._buffer) - self._end < _READ_BYTES // 4:
            self._make_room(_READ_BYTES)
        return self._view[self._end :]

    def _make_room(self, needed: int) -> None:
        """Move the unparsed bytes to the front, and grow the buffer to hold ``needed``."""
        remaining = self._end - self._start
        if self._start:
            self._view[:remaining] = self._view[self._start : self._end]
            self._start, self._end = 0, remaining
        if len(self._buffer) < needed + _READ_BYTES // 4:
            bigger = bytearray(needed + _READ_BYTES)
            bigger[:remaining] = self._view[:remaining]
            self._view.release()
            self._buffer = bigger
            self._view = memoryview(bigger)

    def buffer_updated(self, nbytes: int) -> None:
        if self._batch is None:  # (writes held since earlier in this pass stay first)
            self._batch = []
        try:
            with self.service.requests_held():
                direct, self._direct = self._direct, None
                if direct is not None:
                    assert nbytes <= self._data_left  # the view handed out was no larger
                    self._data_left -= nbytes
                    if not direct.local_closed:
                        direct.filled_in_place(nbytes)
                    if self._data_left == 0:
                        self._data_done()
                else:
                    self._end += nbytes
                    self._parse()
        except ConnectionError_ as exc:
            self._fail(exc.code, exc.debug)
        finally:
            self._write_batch()
        if self._start == self._end:
            self._start = self._end = 0

    def abort(self) -> None:
        """Drop the connection now, unsent bytes and all, and cancel every call still open."""
        self.close(at_once=True)
        self._cancel_calls()

    def _cancel_calls(self) -> None:
        for call in list(self._streams.values()):
            call.remote_closed = call.local_closed = True
            call.cancel()
            self._abandon_views(call)

    def eof_received(self) -> bool | None:
        return None  # close the transport

    def _parse(self) -> None:
        view = self._view
        if self._preface:
            if self._end - self._start < len(frames.PREFACE):
                if frames.PREFACE.startswith(view[self._start : self._end]):
                    return
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 client")
            if view[self._start : self._start + len(frames.PREFACE)] != frames.PREFACE:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "not an HTTP/2 client")
            self._start += len(frames.PREFACE)
            self._preface = False
        unpack = frames.HEADER.unpack_from
        while True:
            pos, end = self._start, self._end
            if self._data_left:
                take = min(self._data_left, end - pos)
                if take == 0:
                    return
                self._start = pos + take
                self._data_left -= take
                self._data_payload(view[pos : pos + take])
                if self._data_left == 0:
                    self._data_done()
                continue
            if end - pos < frames.HEADER_SIZE:
                return
            word, flags, stream = unpack(view, pos)
            length, kind = word >> 8, word & 0xFF
            stream &= 0x7FFFFFFF
            if length > MAX_FRAME_SIZE:
                raise ConnectionError_(ErrorCode.FRAME_SIZE_ERROR, f"a frame of {length} bytes")
            if not self._settings_seen and kind != frames.SETTINGS:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "SETTINGS must come first")
            if self._continuation is not None and kind != frames.CONTINUATION:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "CONTINUATION expected")
            if kind == frames.DATA and not flags & frames.PADDED:
                self._start = pos + frames.HEADER_SIZE
                self._data_begin(stream, flags, length)
                continue
            if end - pos < frames.HEADER_SIZE + length:
                if frames.HEADER_SIZE + length > len(self._buffer):
                    self._make_room(frames.HEADER_SIZE + length)
                return
            self._start = pos + frames.HEADER_SIZE + length
            self._frame(kind, flags, stream, view[pos + frames.HEADER_SIZE : self._start])

    def _frame(self, kind: int, flags: int, stream: int, payload: memoryview) -> None:
        if kind == frames.HEADERS:
            self._headers_frame(flags, stream, payload)
        elif kind == frames.CONTINUATION:
            self._continuation_frame(flags, stream, payload)
        elif kind == frames.RST_STREAM:
            self._rst_stream_frame(stream, payload)
        elif kind == frames.WINDOW_UPDATE:
            self._window_update_frame(stream, payload)
        elif kind == frames.SETTINGS:
            self._settings_frame(flags, stream, payload)
        elif kind == frames.PING:
            self._ping_frame(flags, stream, payload)
        elif kind == frames.GOAWAY:
            if stream:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
            self._goaway = self._last_stream if self._goaway is None else self._goaway
            if not self._streams:
                self.close()
        elif kind == frames.DATA:  # padded (unpadded DATA is read as it comes)
            self._padded_data_frame(flags, stream, payload)
        elif kind == frames.PRIORITY:
            if stream == 0:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
            if len(payload) != 5:
                self._reset(stream, ErrorCode.FRAME_SIZE_ERROR)
        elif kind == frames.PUSH_PROMISE:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE from a client")
        # Frames of other types are ignored (RFC 9113 section 4.1).

    # --- HEADERS --------------------------------------------------------------------------

    def _headers_frame(self, flags: int, stream: int, payload: memoryview) -> None:
        if stream == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        start, end = 0, len(payload)
        if flags & frames.PADDED:
            if not payload:
                raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "padded HEADERS too short")
            start, end = 1, end - payload[0]
        if flags & frames.PRIORITY_FLAG:
            start += 5
        if end < start:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "HEADERS padding too long")
        block = payload[start:end].tobytes()
        if flags & _END_HEADERS:
            self._header_block(stream, bool(flags & _END_STREAM), block)
        else:
            self._continuation = (stream, bool(flags & _END_STREAM), bytearray(block))

    def _continuation_frame(self, flags: int, stream: int, payload: memoryview) -> None:
        pending = self._continuation
        if pending is None or pending[0] != stream:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "unexpected CONTINUATION")
        pending[2].extend(payload)
        if len(pending[2]) > _MAX_HEADER_BLOCK:
            raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
        if flags & _END_HEADERS:
            self._continuation = None
            self._header_block(stream, pending[1], bytes(pending[2]))

    def _header_block(self, stream: int, end_stream: bool, block: bytes) -> None:
        if len(block) > _MAX_HEADER_BLOCK:
            raise ConnectionError_(ErrorCode.ENHANCE_YOUR_CALM, "header block too large")
        try:
            head = self._decoder.decode(block)  # always: the HPACK state is the connection's
        except HeaderError as exc:
            raise ConnectionError_(ErrorCode.COMPRESSION_ERROR, str(exc)) from None
        call = self._streams.get(stream)
        if call is not None:  # trailers of the request (gRPC clients send none)
            if not end_stream or call.remote_closed:
                self._reset(stream, ErrorCode.PROTOCOL_ERROR)
            else:
                call.end_of_requests()
            return
        if stream % 2 == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {stream}")
        if stream <= self._last_stream:  # a stream that has ended
            self._write(frames.rst_stream(stream, ErrorCode.STREAM_CLOSED))
            return
        self._last_stream = stream
        if self._goaway is not None or len(self._streams) >= MAX_CONCURRENT_STREAMS:
            self._write(frames.rst_stream(stream, ErrorCode.REFUSED_STREAM))
            return
        if head.method != b"POST" or not head.is_grpc:
            self._http_error(stream, 405 if head.method != b"POST" else 415, end_stream)
            return
        method = self.service.methods.get(head.path)
        call = Call(self, stream, head, method, self._peer_initial_window, STREAM_WINDOW)
        self._streams[stream] = call
        if head.size > MAX_HEADER_LIST_SIZE:  # a client past the limit the server announced
            call.refuse(
                StatusCode.RESOURCE_EXHAUSTED,
                f"received metadata size exceeds limit ({head.size} vs. {MAX_HEADER_LIST_SIZE})",
            )
        elif method is None:
            call.refuse(StatusCode.UNIMPLEMENTED, "Method not found!")
        else:
            refusal = None if self.service.refusal is None else self.service.refusal(method, head)
            if refusal is not None:
                call.refuse(status_code(refusal), refusal.message)
            else:
                call.start()
        if end_stream:
            call.end_of_requests()
        self.call_done(call)

    def _http_error(self, stream: int, status: int, end_stream: bool) -> None:
        """Answer a request that is not gRPC with HTTP ``status`` alone."""
        self._write_headers(stream, headers.http_status(status), True)
        if not end_stream:
            self._write(frames.rst_stream(stream, ErrorCode.NO_ERROR))

    # --- DATA -----------------------------------------------------------------------------

    def _data_begin(self, stream: int, flags: int, length: int) -> None:
        """A DATA frame's header: its payload is read as it comes (``_data_payload``)."""
        call = self._data_target(stream, length)
        self._data_call, self._data_left, self._data_end = call, length, bool(flags & _END_STREAM)
        if length == 0:
            self._data_done()

    def _data_target(self, stream: int, length: int) -> Call | None:
        """The call a DATA frame of ``length`` flow-controlled bytes is for (None: dropped),
        with both windows charged."""
        if stream == 0:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        if stream > self._last_stream:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, f"DATA on idle stream {stream}")
        self._recv_window -= length
        if self._recv_window < 0:
            raise ConnectionError_(ErrorCode.FLOW_CONTROL_ERROR, "the connection window")
        self._recv_unacked += length
        if self._recv_unacked >= CONNECTION_WINDOW // 2:
            self._write(frames.window_update(0, self._recv_unacked))
            self._recv_window += self._recv_unacked
            self._recv_unacked = 0
        call = self._streams.get(stream)
        if call is None or call.local_closed:
            return None  # a stream that ended (maybe reset by the server): dropped
        if call.remote_closed:  # DATA after the client's END_STREAM
            self._reset(stream, ErrorCode.STREAM_CLOSED)
            return None
        call.recv_window -= length
        if call.recv_window < 0:
            self._reset(stream, ErrorCode.FLOW_CONTROL_ERROR)
            return None
        call.unacked += length
        return call

    def _data_payload(self, chunk: memoryview) -> None:
        call = self._data_call
        if call is None or call.local_closed:
            return
        try:
            call.data(chunk)
        except CallError as error:
            call.finish(error.code, error.message)
            call.cancel()
            self._data_call = None

    def _data_done(self) -> None:
        call, self._data_call = self._data_call, None
        if call is None or call.local_closed:  # (closed locally is closed both ways)
            return
        if self._data_end:
            call.end_of_requests()
            self.call_done(call)
        else:
            self.give_back_window(call)

    def _padded_data_frame(self, flags: int, stream: int, payload: memoryview) -> None:
        if not payload or payload[0] > len(payload) - 1:
            raise ConnectionError_(ErrorCode.PROTOCOL_ERROR, "DATA padding too long")
        call = self._data_target(stream, len(payload))
        self._data_call, self._data_end = call, bool(flags & _END_STREAM)
        self._data_payload(payload[1 : len(payload) - payload[0]])
        self._data_done()

    def give_back_window(self, call: Call) -> None:
        """Give the client back the stream window of the bytes ``call`` has taken, once that
        is half the window (or all of what it holds)."""
        if call.unacked >= STREAM_WINDOW // 2 and not call.holds_unread and not call.remote_closed:
            self._write(frames.window_update(call.id, call.unacked))
            call.recv_window += call.unacked
            call.unacked = 0


def _peer(address: Any) -> str:
    if isinstance(address, tuple) and len(address) >= 2:
        host = address[0]
        return f"ipv6:[{host}]:{address[1]}" if ":" in host else f"ipv4:{host}:{address[1]}"
    return "unix:"
