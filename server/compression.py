"""Compression for both transports: inflating compressed requests (HTTP's
``Content-Encoding``, gRPC's ``grpc-encoding``), each of which words the refusals its own way,
and compressing responses (HTTP's ``Accept-Encoding``, and gRPC's as
``--grpc-infer-response-compression-level`` asks)."""

from __future__ import annotations

import zlib


class InflateError(ValueError):
    """Bytes that do not inflate: not gzip, zlib or raw deflate, or cut short."""


class Truncated(InflateError):
    """The compressed stream ends before its end mark."""


class TooLarge(InflateError):
    """Inflating would pass the limit; ``size`` is what was seen of the output (at least
    ``limit + 1`` bytes)."""

    def __init__(self, size: int) -> None:
        super().__init__(f"more than {size - 1} bytes once inflated")
        self.size = size


def inflate(data: bytes | bytearray | memoryview, limit: int) -> bytes:
    """Inflate gzip or zlib data (raw deflate is tried when it is neither), refusing output
    beyond ``limit`` bytes before producing it."""
    # 32 + MAX_WBITS accepts both gzip and zlib headers.
    for wbits in (32 + zlib.MAX_WBITS, -zlib.MAX_WBITS):
        inflater = zlib.decompressobj(wbits)
        try:
            out = inflater.decompress(data, limit + 1)
        except zlib.error:
            continue
        if len(out) > limit or inflater.unconsumed_tail:
            raise TooLarge(len(out) + len(inflater.unconsumed_tail))
        if not inflater.eof:
            raise Truncated("cut short")
        return out
    raise InflateError("not gzip or deflate data")


def compress(parts: list[bytes | memoryview], encoding: str) -> bytes:
    """``parts`` as one gzip or zlib ("deflate") stream, at zlib's default level (6)."""
    wbits = 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS
    deflater = zlib.compressobj(zlib.Z_DEFAULT_COMPRESSION, zlib.DEFLATED, wbits)
    out = [deflater.compress(part) for part in parts]
    out.append(deflater.flush())
    return b"".join(out)


#: ``--grpc-infer-response-compression-level``'s values, as tritonserver takes them.
GRPC_LEVELS = ("none", "low", "medium", "high")
#: grpc core's ranking of the algorithms a level picks from (the peer's accepted ones only).
_GRPC_RANKING = ("gzip", "deflate")


def grpc_algorithm(level: str, accepted: frozenset[str]) -> str | None:
    """The algorithm grpc core compresses a response with at ``level`` for a client that
    accepts ``accepted`` (its ``grpc-accept-encoding``): low the first of gzip and deflate the
    client takes, medium the middle one, high the last; None (identity) at level none or when
    the client takes neither."""
    if level == "none":
        return None
    ranked = [name for name in _GRPC_RANKING if name in accepted]
    if not ranked:
        return None
    if level == "low":
        return ranked[0]
    if level == "medium":
        return ranked[len(ranked) // 2]
    return ranked[-1]


def grpc_compress(parts: list[bytes | memoryview], algorithm: str) -> bytes | None:
    """One message, given in ``parts``, compressed as grpc core does it (zlib's default level;
    deflate is the zlib format), or None when that would not make it smaller (it is sent as it
    is)."""
    out = compress(parts, algorithm)
    return out if len(out) < sum(len(part) for part in parts) else None
