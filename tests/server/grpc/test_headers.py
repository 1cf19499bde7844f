"""Request header blocks decoded (and the decoding of repeated blocks kept while the HPACK
table stands still); the server's own blocks read back by an independent decoder."""

from __future__ import annotations

from typing import cast

import hpack
import pytest

from server.grpc import headers
from server.grpc.headers import (
    DECODED_LIST_LIMIT,
    HeaderError,
    RequestHeaderDecoder,
    parse_timeout,
)

CALL = [
    (":method", "POST"),
    (":scheme", "http"),
    (":path", "/inference.GRPCInferenceService/ModelInfer"),
    (":authority", "127.0.0.1:8001"),
    ("content-type", "application/grpc"),
    ("te", "trailers"),
    ("user-agent", "grpc-c++/1.48"),
]


def _decode(decoder: hpack.Decoder, block: bytes) -> list[tuple[str, str]]:
    """hpack's annotation says Iterable[tuple[bytes, bytes]]; decoded not raw, the list is of
    str pairs."""
    return cast("list[tuple[str, str]]", decoder.decode(block))


def test_a_call_head() -> None:
    block = hpack.Encoder().encode(
        [*CALL, ("grpc-timeout", "250m"), ("grpc-encoding", "gzip"), ("x-id", "7"),
         ("x-raw-bin", "AP8")]
    )
    head = RequestHeaderDecoder().decode(block)
    assert (head.method, head.path, head.is_grpc) == (
        b"POST", "/inference.GRPCInferenceService/ModelInfer", True
    )
    assert (head.timeout, head.encoding) == (0.25, "gzip")
    assert head.metadata == (("user-agent", "grpc-c++/1.48"), ("x-id", "7"),
                             ("x-raw-bin", b"\x00\xff"))


def test_repeated_blocks_are_decoded_once_while_the_table_stands_still() -> None:
    encoder = hpack.Encoder()
    decoder = RequestHeaderDecoder()
    first = decoder.decode(encoder.encode(CALL))  # fills the dynamic table
    repeat = encoder.encode(CALL)  # all indexed
    assert decoder.decode(repeat) is decoder.decode(repeat)
    assert decoder.decode(repeat) == first
    # A block that adds to the table moves every dynamic index: the same bytes that meant
    # one header list before mean another now, and are decoded afresh.
    other = [*CALL[:2], (":path", "/other"), *CALL[3:]]
    assert decoder.decode(encoder.encode(other)).path == "/other"
    assert decoder.decode(encoder.encode(other)).path == "/other"
    assert decoder.decode(encoder.encode(CALL)).path == CALL[2][1]


def test_cached_blocks_follow_the_table_exactly() -> None:
    """Decoded beside hpack's own decoder, fed the same blocks, over many table changes."""
    encoder = hpack.Encoder()
    encoder.header_table_size = 256  # small: entries are evicted often
    ours = RequestHeaderDecoder()
    ours._decoder.header_table_size = 256
    reference = hpack.Decoder()
    reference.header_table_size = 256
    for index in range(300):
        call = [*CALL[:2], (":path", f"/m{index % 7}"), *CALL[3:], ("x-n", str(index % 5))]
        block = encoder.encode(call)
        expected = dict(_decode(reference, block))
        head = ours.decode(block)
        assert head.path == expected[":path"]
        assert dict(head.metadata)["x-n"] == expected["x-n"]


def test_a_malformed_block_is_an_error() -> None:
    with pytest.raises(HeaderError):
        RequestHeaderDecoder().decode(b"\xff\xff\xff\xff\xff")


def test_a_header_list_is_measured_and_past_the_decoding_limit_an_error() -> None:
    head = RequestHeaderDecoder().decode(hpack.Encoder().encode([*CALL, ("x-big", "v" * 2000)]))
    assert head.size == sum(len(n) + len(v) + 32 for n, v in [*CALL, ("x-big", "v" * 2000)])
    # One literal added to the table and referenced over and over: past the limit decoded.
    encoder = hpack.Encoder()
    encoder.encode([("x-huge", "h" * 4000)])
    repeat = encoder.encode([("x-huge", "h" * 4000)])  # one byte: the indexed entry
    decoder = RequestHeaderDecoder()
    decoder.decode(hpack.Encoder().encode([("x-huge", "h" * 4000)]))
    with pytest.raises(HeaderError):
        decoder.decode(repeat * (DECODED_LIST_LIMIT // 4000 + 1))


@pytest.mark.parametrize(
    "value, seconds",
    [(b"1H", 3600.0), (b"2M", 120.0), (b"3S", 3.0), (b"250m", 0.25), (b"7u", 7e-6),
     (b"99999999n", 0.099999999), (b"123456789m", None), (b"5", None), (b"m", None),
     (b"5x", None), (b"-5m", None)],
)
def test_grpc_timeout(value: bytes, seconds: float | None) -> None:
    assert parse_timeout(value) == (None if seconds is None else pytest.approx(seconds))


def test_the_servers_blocks_decode_as_meant() -> None:
    decoder = hpack.Decoder()
    assert _decode(decoder, headers.RESPONSE) == [
        (":status", "200"), ("content-type", "application/grpc")
    ]
    message = "x" * 300  # a length past the 7-bit prefix
    assert _decode(decoder, headers.trailers(14, message.encode())) == [
        ("grpc-status", "14"), ("grpc-message", message)
    ]
    assert _decode(decoder, headers.OK_TRAILERS) == [("grpc-status", "0")]
    assert _decode(decoder, headers.http_status(415)) == [(":status", "415")]
    assert _decode(decoder, headers.table_size_update(0) + headers.RESPONSE)[0] == (
        ":status", "200"
    )
    assert decoder.header_table_size == 0
