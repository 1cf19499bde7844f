"""HTTP/2 frames (RFC 9113, sections 4 and 6): their numbers, and the frames a server writes.

A frame is a 9-byte header (a 24-bit payload length, the type, the flags, a 31-bit stream id)
and its payload. Reading them is ``server.grpc.connection``'s work; this module only knows the
wire layout.
"""

from __future__ import annotations

import enum
import struct

#: (length << 8 | type), flags, stream id: the 9 bytes of a frame header.
HEADER = struct.Struct(">IBI")
HEADER_SIZE = HEADER.size
#: What a client sends first (RFC 9113 section 3.4), before its SETTINGS frame.
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"

# Frame types.
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

#: The default and largest allowed values of SETTINGS_MAX_FRAME_SIZE.
DEFAULT_MAX_FRAME_SIZE = 1 << 14
LARGEST_FRAME_SIZE = (1 << 24) - 1
#: The window every stream and the connection start with, and the largest one allowed.
DEFAULT_WINDOW = 65_535
LARGEST_WINDOW = (1 << 31) - 1


class ErrorCode(enum.IntEnum):
    """RST_STREAM and GOAWAY error codes (RFC 9113 section 7)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


class Setting(enum.IntEnum):
    """SETTINGS parameters (RFC 9113 section 6.5.2)."""

    HEADER_TABLE_SIZE = 0x1
    ENABLE_PUSH = 0x2
    MAX_CONCURRENT_STREAMS = 0x3
    INITIAL_WINDOW_SIZE = 0x4
    MAX_FRAME_SIZE = 0x5
    MAX_HEADER_LIST_SIZE = 0x6


_SETTING = struct.Struct(">HI")
_U32 = struct.Struct(">I")
_GOAWAY = struct.Struct(">II")


def header(kind: int, flags: int, stream: int, length: int) -> bytes:
    """A frame header alone (the payload written after it)."""
    return HEADER.pack(length << 8 | kind, flags, stream)


def frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return HEADER.pack(len(payload) << 8 | kind, flags, stream) + payload


def settings(values: dict[Setting, int]) -> bytes:
    payload = b"".join(_SETTING.pack(key, value) for key, value in values.items())
    return frame(SETTINGS, 0, 0, payload)


SETTINGS_ACK = frame(SETTINGS, ACK, 0)


def ping(payload: bytes, ack: bool) -> bytes:
    return frame(PING, ACK if ack else 0, 0, payload)


def window_update(stream: int, increment: int) -> bytes:
    return frame(WINDOW_UPDATE, 0, stream, _U32.pack(increment))


def rst_stream(stream: int, code: ErrorCode) -> bytes:
    return frame(RST_STREAM, 0, stream, _U32.pack(code))


def goaway(last_stream: int, code: ErrorCode, debug: bytes = b"") -> bytes:
    return frame(GOAWAY, 0, 0, _GOAWAY.pack(last_stream, code) + debug)


def read_u32(payload: memoryview | bytes) -> int:
    value: int = _U32.unpack_from(payload)[0]
    return value


def read_settings(payload: memoryview) -> list[tuple[int, int]]:
    """The (identifier, value) pairs of a SETTINGS payload (a multiple of 6 bytes)."""
    return [_SETTING.unpack_from(payload, offset) for offset in range(0, len(payload), 6)]
