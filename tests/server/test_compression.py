"""Inflating compressed requests (``server.compression``), shared by HTTP and gRPC."""

from __future__ import annotations

import gzip
import zlib

import pytest

from server.compression import InflateError, TooLarge, Truncated, inflate

DATA = b"tensor bytes " * 1000


def _raw_deflate(data: bytes) -> bytes:
    deflater = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return deflater.compress(data) + deflater.flush()


@pytest.mark.parametrize(
    "packed",
    [gzip.compress(DATA, mtime=0), zlib.compress(DATA), _raw_deflate(DATA)],
    ids=["gzip", "zlib", "raw-deflate"],
)
def test_gzip_zlib_and_raw_deflate_inflate(packed: bytes) -> None:
    assert inflate(memoryview(packed), len(DATA)) == DATA


def test_output_past_the_limit_is_refused() -> None:
    with pytest.raises(TooLarge) as refused:
        inflate(gzip.compress(DATA), len(DATA) - 1)
    assert refused.value.size > len(DATA) - 1


def test_a_cut_stream_and_garbage_are_refused() -> None:
    with pytest.raises(Truncated):
        inflate(gzip.compress(DATA)[:-20], len(DATA))
    with pytest.raises(InflateError):
        inflate(b"\x00\x01 not compressed", len(DATA))
