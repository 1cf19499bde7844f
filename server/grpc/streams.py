"""A gRPC connection's streams and what the server sends on them: HTTP/2 flow control from the
server's side (RFC 9113 section 5.2), as the base of ``server.grpc.connection``, which reads.

A unary call's answer (HEADERS, DATA, trailers) is one write when the client's windows have
room for it, nearly always; otherwise, and for streamed replies, a call's DATA waits in
``Call.outgoing`` until the connection's and the stream's windows, and the transport's
buffer, let it go. Writes made while a read is parsed are held and written together at its
end; writes made elsewhere (answers resumed when the executor replies) at the end of the
loop's pass, so that the answers of one dynamic batch for one connection are one write.

A message given as ``Views`` (parts viewing the executor's output arena) is written from its
views; its release waits until the transport's buffer is empty, i.e. the kernel has every
byte written so far (the transport may hold references to what it could not write at once).
The transport's high-water mark is 0, so that it tells (``resume_writing``) when it empties.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import Callable

from server.grpc import frames, headers, keepalive
from server.grpc.call import PREFIX_SIZE, Call, Payload, Views, discard, payload_size
from server.grpc.frames import ErrorCode
from server.grpc.status import StatusCode, encode_message
from server.settings import GrpcKeepalive

#: A DATA message part at most this large is copied into one write with its frames.
_JOIN_BYTES = 1 << 14
#: Writes held while a read is parsed go to the transport once they pass this size.
_BATCH_BYTES = 1 << 18
#: How long a closed connection may take to send what it was still sending.
CLOSE_GRACE_S = 5.0

_RESPONSE = headers.RESPONSE
_OK_TRAILERS = headers.OK_TRAILERS
_END_HEADERS = frames.END_HEADERS
_END_STREAM = frames.END_STREAM


class Http2Streams(asyncio.BufferedProtocol):
    """The streams (``Call``) of one connection and the server's side of its windows."""

    def __init__(self, keepalive_flags: GrpcKeepalive) -> None:
        self.loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._streams: dict[int, Call] = {}
        self._last_stream = 0
        self._send_window = frames.DEFAULT_WINDOW
        self._peer_initial_window = frames.DEFAULT_WINDOW
        self._peer_max_frame = frames.DEFAULT_MAX_FRAME_SIZE
        self._table_update = b""  # an HPACK table size update owed to the client
        self._table_size = 4096  # the HPACK table size the client's decoder expects of us
        self._blocked: dict[int, Call] = {}  # streams waiting for window or the transport
        self._paused = False  # the transport's buffer is full
        self._batch: list[bytes | memoryview] | None = None  # writes held (_write_batch)
        self._batch_bytes = 0
        # releases of ``Views`` handed to the transport, due once its buffer is empty
        self._unsettled: list[Callable[[], None]] = []
        # Going away: the last stream served after GOAWAY, or None.
        self._goaway: int | None = None
        self._pings = keepalive.PingPolicy(keepalive_flags)
        self._keepalive = keepalive.KeepalivePings(keepalive_flags)

    # --- the transport --------------------------------------------------------------------

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._settle()
        self._flush_blocked()

    def _settle(self) -> None:
        """Release the views handed to the transport, if it has given all it held to the
        kernel (once it has not: at ``resume_writing``, or when the connection is lost)."""
        if (
            self._unsettled and self._batch is None and self._transport is not None
            and not self._transport.get_write_buffer_size()
        ):
            self._release_unsettled()

    def _release_unsettled(self) -> None:
        unsettled, self._unsettled = self._unsettled, []
        for release in unsettled:
            release()

    def _abandon_views(self, call: Call) -> None:
        """``call``'s queued messages will not be sent (further): they are released once the
        transport holds nothing of what was written of them."""
        call.outgoing.clear()  # (nothing may write from memory about to be released)
        releases, call.releases = call.releases, collections.deque()
        self._unsettled.extend(release for _, release in releases)
        self._settle()

    def _hold_until_pass_ends(self) -> bool:
        """Hold writes made outside a read (answers resumed by the executor's replies) until
        the end of this pass of the loop: the answers of one dynamic batch, resumed together,
        go out in one write. False: the connection is closed, nothing is held."""
        if self._transport is None:
            return False
        self._batch = []
        self.loop.call_soon(self._write_batch)
        return True

    def _write(self, data: bytes | memoryview) -> None:
        self._write_parts([data])

    def _write_parts(self, parts: list[bytes | memoryview]) -> None:
        if self._batch is None and not self._hold_until_pass_ends():
            return
        assert self._batch is not None
        self._batch.extend(parts)
        self._batch_bytes += sum(len(part) for part in parts)
        if self._batch_bytes > _BATCH_BYTES:
            self._write_through()

    def _write_through(self) -> None:
        """Hand what is held to the transport now, holding on afterwards: its buffer, not
        ours, then tells when it is full (``pause_writing`` stops the streams' DATA)."""
        self._write_batch()
        self._batch = []

    def _write_batch(self) -> None:
        """Write what was held (while parsing, or until the end of the loop's pass)."""
        batch, self._batch = self._batch, None
        self._batch_bytes = 0
        if batch and self._transport is not None:
            self._transport.writelines(batch)
        self._settle()

    def close(self, at_once: bool = False) -> None:
        """Close the connection once what was written has been sent (``at_once``: now,
        dropping it); later writes are dropped. A client that reads nothing would keep a
        graceful close waiting for ever: it is dropped after ``CLOSE_GRACE_S``."""
        self._write_batch()
        transport, self._transport = self._transport, None
        if transport is None:
            return
        if at_once:
            transport.abort()
            return
        transport.close()
        self.loop.call_later(CLOSE_GRACE_S, _abort_if_open, transport)

    # --- sending ---------------------------------------------------------------------------

    def _write_headers(self, stream: int, block: bytes, end_stream: bool) -> None:
        """One HEADERS frame: the server's blocks are small (a few fields, ``grpc-message``
        cut to ``MAX_MESSAGE_BYTES``), never past the smallest frame size a client may set."""
        if self._table_update:
            block, self._table_update = self._table_update + block, b""
        flags = _END_HEADERS | _END_STREAM if end_stream else _END_HEADERS
        self._write(frames.header(frames.HEADERS, flags, stream, len(block)) + block)
        self._pings.forgive()
        self._keepalive.data_sent()

    def reply(self, call: Call, payload: Payload, compressed: bool = False) -> None:
        """A unary call's answer: HEADERS, the message, and OK trailers."""
        if call.local_closed:
            discard(payload)
            return
        length = payload_size(payload)
        size = length + PREFIX_SIZE
        if (
            size > self._send_window or size > call.send_window or size > self._peer_max_frame
            or self._paused or self._table_update or call.headers_sent
        ):
            self.send_message(call, payload, compressed)
            self.send_status(call, StatusCode.OK, "")
            return
        self._send_window -= size
        stream = call.id
        block = _response_headers(call)
        head = (
            frames.header(frames.HEADERS, _END_HEADERS, stream, len(block)) + block
            + frames.header(frames.DATA, 0, stream, size)
            + _prefix(length, compressed)
        )
        tail = frames.header(frames.HEADERS, _END_HEADERS | _END_STREAM, stream,
                             len(_OK_TRAILERS)) + _OK_TRAILERS
        if isinstance(payload, Views):
            self._write_parts([head, *payload.parts, tail])
            self._unsettled.append(payload.release)
        elif len(payload) <= _JOIN_BYTES:
            self._write(head + payload + tail)
        else:
            self._write_parts([head, payload, tail])
        self._pings.forgive()
        self._keepalive.data_sent()
        self._closed_locally(call)
        self._settle()

    def send_message(
        self, call: Call, payload: Payload, compressed: bool = False
    ) -> asyncio.Future[None] | None:
        """Queue one response message (``compressed`` with the call's response encoding);
        None once it is all written, else a future that is done when it is."""
        if call.local_closed:
            discard(payload)
            return None
        if not call.headers_sent:
            call.headers_sent = True
            self._write_headers(call.id, _response_headers(call), False)
        size = payload_size(payload)
        call.outgoing.append(_prefix(size, compressed))
        call.queued += size + PREFIX_SIZE
        if isinstance(payload, Views):
            call.outgoing.extend(payload.parts)
            call.releases.append((call.queued, payload.release))
        else:
            call.outgoing.append(payload)
        self._flush(call)
        if call.sent >= call.queued or call.local_closed:
            return None
        written: asyncio.Future[None] = self.loop.create_future()
        call.waiters.append((call.queued, written))
        return written

    def send_status(self, call: Call, code: StatusCode, message: str) -> None:
        """End ``call`` with its status: trailers after its messages, or trailers alone."""
        if call.local_closed:
            return
        if code == StatusCode.OK and not message:
            block = _OK_TRAILERS
        else:
            block = headers.trailers(code, encode_message(message))
        if not call.headers_sent and not call.outgoing:  # a "trailers-only" response
            call.headers_sent = True
            self._write_headers(call.id, _RESPONSE + block, True)
            self._closed_locally(call)
            return
        call.trailers = block
        self._flush(call)

    def _flush(self, call: Call) -> None:
        """Write what ``call`` has queued, as far as the windows and the transport let."""
        outgoing = call.outgoing
        while outgoing:
            if self._paused:
                self._blocked[call.id] = call
                return
            allowed = min(self._send_window, call.send_window, self._peer_max_frame)
            if allowed <= 0:
                if self._send_window <= 0:
                    self._blocked[call.id] = call
                return  # (else the stream's own WINDOW_UPDATE flushes it)
            parts: list[bytes | memoryview] = []
            taken = 0
            while outgoing and taken < allowed:
                chunk = outgoing[0]
                room = allowed - taken
                if len(chunk) <= room:
                    parts.append(chunk)
                    taken += len(chunk)
                    outgoing.popleft()
                else:
                    chunk = memoryview(chunk)
                    parts.append(chunk[:room])
                    outgoing[0] = chunk[room:]
                    taken += room
            self._send_window -= taken
            call.send_window -= taken
            call.sent += taken
            self._write_parts([frames.header(frames.DATA, 0, call.id, taken), *parts])
            self._keepalive.data_sent()
            self._pings.forgive()
            waiters = call.waiters
            while waiters and waiters[0][0] <= call.sent:
                _, written = waiters.popleft()
                if not written.done():
                    written.set_result(None)
            releases = call.releases
            while releases and releases[0][0] <= call.sent:
                self._unsettled.append(releases.popleft()[1])
        if call.trailers is not None and not call.local_closed:
            self._write_headers(call.id, call.trailers, True)
            call.trailers = None
            self._closed_locally(call)
        self._settle()

    def _flush_blocked(self) -> None:
        blocked, self._blocked = self._blocked, {}
        for call in blocked.values():
            if not call.local_closed:
                self._flush(call)

    # --- the streams' ends -----------------------------------------------------------------

    def _closed_locally(self, call: Call) -> None:
        """The server has sent the end of ``call``'s stream."""
        call.local_closed = True
        call.closed()
        self._blocked.pop(call.id, None)
        if not call.remote_closed:  # the client still sending: it need not (RFC 9113 8.1)
            call.remote_closed = True
            self._write(frames.rst_stream(call.id, ErrorCode.NO_ERROR))
        self.call_done(call)

    def call_done(self, call: Call) -> None:
        """Forget ``call`` once its stream has ended both ways and its handler is over."""
        if not (call.local_closed and call.remote_closed) or call.running:
            return
        forgotten = self._streams.pop(call.id, None) is not None
        if forgotten and self._goaway is not None and not self._streams:
            self.close()  # going away, and the last stream is done

    def _drop(self, stream: int) -> None:
        """The stream has ended both ways, answered or not: its handler is stopped."""
        call = self._streams.get(stream)
        if call is not None:
            call.remote_closed = call.local_closed = True
            call.cancel()
            self._blocked.pop(stream, None)
            self._abandon_views(call)
            self.call_done(call)

    def go_away(self) -> None:
        """Serve the streams already open, no new ones, then close (GOAWAY NO_ERROR)."""
        if self._goaway is None:
            self._goaway = self._last_stream
            self._write(frames.goaway(self._last_stream, ErrorCode.NO_ERROR))
        if not self._streams:
            self.close()


def _abort_if_open(transport: asyncio.Transport) -> None:
    if transport.get_write_buffer_size():  # still sending: the client reads nothing
        transport.abort()


def _response_headers(call: Call) -> bytes:
    """The HEADERS block that starts ``call``'s response (naming its grpc-encoding if any)."""
    encoding = call.response_encoding
    return _RESPONSE if encoding is None else headers.COMPRESSED_RESPONSE[encoding]


def _prefix(length: int, compressed: bool) -> bytes:
    """gRPC's message prefix: the compressed flag, the big-endian length."""
    return (b"\x01" if compressed else b"\x00") + length.to_bytes(4, "big")
