"""Inflating compressed requests (``server.compression``), shared by HTTP and gRPC; and gRPC's
response compression."""

from __future__ import annotations

import gzip
import zlib

import pytest

from server.compression import (
    InflateError,
    TooLarge,
    Truncated,
    grpc_algorithm,
    grpc_compress,
    inflate,
)

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


@pytest.mark.parametrize(
    "level, accepted, algorithm",
    [
        ("none", {"identity", "gzip", "deflate"}, None),
        ("low", {"identity", "gzip", "deflate"}, "gzip"),
        ("medium", {"identity", "gzip", "deflate"}, "deflate"),
        ("high", {"identity", "gzip", "deflate"}, "deflate"),
        ("low", {"identity", "deflate"}, "deflate"),
        ("high", {"gzip"}, "gzip"),
        ("medium", {"identity"}, None),
        ("high", set(), None),  # no grpc-accept-encoding at all
    ],
)
def test_a_level_picks_from_what_the_client_accepts_as_grpc_core_does(
    level: str, accepted: set[str], algorithm: str | None
) -> None:
    assert grpc_algorithm(level, frozenset(accepted)) == algorithm


def test_grpc_compress_writes_gzip_and_zlib() -> None:
    packed = grpc_compress([DATA], "gzip")
    assert packed is not None and packed[:2] == b"\x1f\x8b" and gzip.decompress(packed) == DATA
    packed = grpc_compress([memoryview(DATA[:100]), DATA[100:]], "deflate")
    assert packed is not None and zlib.decompress(packed) == DATA


def test_a_message_that_does_not_shrink_is_left_as_it_is() -> None:
    assert grpc_compress([bytes(range(10))], "gzip") is None
