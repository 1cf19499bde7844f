"""Header blocks: a request's decoded into what the gRPC layer needs, a response's written.

Decoding is the ``hpack`` library's, and its cost is the header block's: about 14 µs for the
nine indexed fields a gRPC client sends with every call once its first call has put them in
the dynamic table. Those later blocks are the same bytes call after call, and decode to the
same headers as long as the table is unchanged, so what a block decodes to is kept (and the
whole cache dropped whenever a block changes the table).

Responses are written without the dynamic table (literals "without indexing"): the server's
few header blocks are then the same bytes every time, built once.
"""

from __future__ import annotations

import base64
import binascii
import logging
from collections.abc import Iterable
from dataclasses import dataclass

import hpack
from hpack.hpack import encode_integer
from hpack.table import HeaderTable

# hpack logs every field it decodes at DEBUG: never wanted, even with --log-verbose.
logging.getLogger("hpack").setLevel(logging.INFO)

#: Distinct header blocks kept at most; past it the cache starts afresh.
_CACHED_BLOCKS = 256
_TIME_UNITS = {b"H": 3600.0, b"M": 60.0, b"S": 1.0, b"m": 1e-3, b"u": 1e-6, b"n": 1e-9}
#: Headers of the transport, not metadata of the call (what grpc core keeps from handlers).
_TRANSPORT = frozenset(
    {b"content-type", b"te", b"grpc-timeout", b"grpc-encoding", b"grpc-accept-encoding"}
)


class HeaderError(Exception):
    """A header block that cannot be decoded: the connection cannot go on (its HPACK state
    is lost)."""


@dataclass(frozen=True)
class RequestHead:
    """What a call's HEADERS say."""

    method: bytes  # :method
    path: str  # :path, "" when missing
    content_type: bytes
    timeout: float | None  # seconds, from grpc-timeout
    encoding: str  # grpc-encoding ("identity" when absent)
    metadata: tuple[tuple[str, str | bytes], ...]  # the rest; "-bin" values base64-decoded
    size: int  # of the header list as HPACK counts it (each field 32 bytes more)
    accepted: frozenset[str] = frozenset()  # grpc-accept-encoding's names, lower case

    @property
    def is_grpc(self) -> bool:
        return self.content_type.startswith(b"application/grpc")


class _Table(HeaderTable):
    """hpack's dynamic table, counting its changes (an entry added, the size updated)."""

    def __init__(self) -> None:
        super().__init__()
        self.changes = 0

    def add(self, name: bytes, value: bytes) -> None:
        self.changes += 1
        super().add(name, value)

    @property
    def maxsize(self) -> int:
        return self._maxsize

    @maxsize.setter
    def maxsize(self, value: int) -> None:
        self.changes += 1
        HeaderTable.maxsize.fset(self, value)  # type: ignore[attr-defined]


#: The largest header list decoded at all: past it the HPACK state is lost with the block, so
#: the connection ends. A list over the server's announced limit but under this one fails its
#: call alone (``RequestHead.size``).
DECODED_LIST_LIMIT = 1 << 20


class RequestHeaderDecoder:
    """One connection's HPACK decoding of request header blocks."""

    def __init__(self) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=DECODED_LIST_LIMIT)
        self._table = _Table()
        self._decoder.header_table = self._table
        self._cache: dict[bytes, RequestHead] = {}

    def decode(self, block: bytes) -> RequestHead:
        """The head of the call whose (complete) header block is ``block``; ``HeaderError``
        for a block that is not valid HPACK (or decodes past ``DECODED_LIST_LIMIT``)."""
        head = self._cache.get(block)
        if head is not None:
            return head
        changes = self._table.changes
        try:
            fields = self._decoder.decode(block, raw=True)
        except hpack.HPACKError as exc:
            raise HeaderError(str(exc)) from None
        head = _head(fields)
        if self._table.changes != changes:
            self._cache.clear()  # what earlier blocks' indices name has moved
        else:
            if len(self._cache) >= _CACHED_BLOCKS:
                self._cache.clear()
            self._cache[block] = head
        return head


def _head(fields: Iterable[tuple[bytes, bytes]]) -> RequestHead:
    method = content_type = b""
    path = ""
    timeout: float | None = None
    encoding = "identity"
    accepted: frozenset[str] = frozenset()
    metadata: list[tuple[str, str | bytes]] = []
    size = 0
    for name, value in fields:
        size += len(name) + len(value) + 32
        if name[:1] == b":":
            if name == b":path":
                path = value.decode("latin-1")
            elif name == b":method":
                method = value
        elif name == b"content-type":
            content_type = value
        elif name == b"grpc-timeout":
            timeout = parse_timeout(value)
        elif name == b"grpc-encoding":
            encoding = value.decode("latin-1")
        elif name == b"grpc-accept-encoding":
            accepted = frozenset(
                part.strip().lower() for part in value.decode("latin-1").split(",")
            )
        elif name not in _TRANSPORT:
            metadata.append(_metadata(name, value))
    return RequestHead(
        method, path, content_type, timeout, encoding, tuple(metadata), size, accepted
    )


def _metadata(name: bytes, value: bytes) -> tuple[str, str | bytes]:
    key = name.decode("latin-1")
    if key.endswith("-bin"):
        try:
            return key, base64.b64decode(value + b"=" * (-len(value) % 4))
        except binascii.Error:
            return key, value
    return key, value.decode("latin-1")


def parse_timeout(value: bytes) -> float | None:
    """Seconds of a ``grpc-timeout`` value (1 to 8 digits and a unit); None if malformed."""
    unit = _TIME_UNITS.get(value[-1:])
    digits = value[:-1]
    if unit is None or not 0 < len(digits) <= 8 or not digits.isdigit():
        return None
    return int(digits) * unit


# --- writing ----------------------------------------------------------------------------------


def _integer(value: int, prefix_bits: int, first: int) -> bytes:
    """An HPACK integer (RFC 7541 section 5.1); ``first`` holds the bits above the prefix."""
    encoded = encode_integer(value, prefix_bits)
    encoded[0] |= first
    return bytes(encoded)


def _string(value: bytes) -> bytes:
    return _integer(len(value), 7, 0) + value


def literal(name: bytes | int, value: bytes) -> bytes:
    """A field "without indexing": the name a static table index, or the name itself."""
    if isinstance(name, int):
        return _integer(name, 4, 0) + _string(value)
    return b"\x00" + _string(name) + _string(value)


_STATUS_200 = b"\x88"  # :status 200, static table entry 8
_STATUS_NAME = 8  # the static table's ":status"
_CONTENT_TYPE_NAME = 31  # the static table's "content-type"
#: The response's HEADERS block.
RESPONSE = _STATUS_200 + literal(_CONTENT_TYPE_NAME, b"application/grpc")
#: The response's HEADERS block of a call whose messages are compressed, by algorithm.
COMPRESSED_RESPONSE = {
    name: RESPONSE + literal(b"grpc-encoding", name.encode("ascii"))
    for name in ("gzip", "deflate")
}
#: The trailers of a call that succeeded.
OK_TRAILERS = literal(b"grpc-status", b"0")


def trailers(code: int, message: bytes) -> bytes:
    """The trailers of a call ending with status ``code`` (``message`` already encoded)."""
    block = literal(b"grpc-status", str(code).encode("ascii"))
    if message:
        block += literal(b"grpc-message", message)
    return block


def table_size_update(size: int) -> bytes:
    """A dynamic table size update (RFC 7541 section 6.3), at the start of a block."""
    return _integer(size, 5, 0x20)


def http_status(status: int) -> bytes:
    """A response of HTTP status ``status`` alone (a request that is not gRPC)."""
    return literal(_STATUS_NAME, str(status).encode("ascii"))
