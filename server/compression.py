"""Inflating compressed requests, for both transports (HTTP's ``Content-Encoding``, gRPC's
``grpc-encoding``), each of which words the refusals its own way."""

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
