"""Unit tests for backends.onnxruntime.strings: BYTES <-> ONNX Runtime str, byte for byte."""

from __future__ import annotations

import random
from collections.abc import Sequence

import numpy as np
import pytest

from backends.onnxruntime.strings import bytes_to_strings, strings_to_bytes


def _objects(items: Sequence[object], shape: tuple[int, ...] | None = None) -> np.ndarray:
    out = np.empty(len(items), dtype=object)
    out[:] = items
    return out.reshape(shape) if shape is not None else out


ELEMENTS = [
    b"",
    b"\x00",
    b"\xff",
    b"a\x00b",
    b"\x00\xff",
    b"\x80",
    b"\xc3",  # truncated UTF-8 sequence
    b"\xc3\xa9",  # valid UTF-8
    b"\xed\xa0\x80",  # UTF-8-encoded surrogate: not valid UTF-8
    b"\xf4\x90\x80\x80",  # beyond U+10FFFF
    b"caf\xe9",  # Latin-1, not UTF-8
    bytes(range(256)),
    "\u65e5\u672c\u8a9e".encode(),
    "\U0001f600".encode(),
]


@pytest.mark.parametrize("element", ELEMENTS, ids=lambda b: b[:8].hex() or "empty")
def test_round_trip_each_element(element: bytes) -> None:
    strings = bytes_to_strings(_objects([element]))
    assert all(type(s) is str for s in strings)
    # ONNX Runtime refuses lone surrogates: none may reach it.
    strings[0].encode("utf-8")
    back = strings_to_bytes(strings)
    assert type(back[0]) is bytes
    assert back[0] == element


def test_round_trip_keeps_shape_and_order() -> None:
    array = _objects(ELEMENTS[:12], (3, 4))
    strings = bytes_to_strings(array)
    assert strings.shape == (3, 4) and strings.dtype == object
    back = strings_to_bytes(strings)
    assert back.shape == (3, 4) and back.dtype == object
    assert back.tolist() == array.tolist()


def test_round_trip_random_bytes() -> None:
    rng = random.Random(1234)
    items = [bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40))) for _ in range(300)]
    back = strings_to_bytes(bytes_to_strings(_objects(items)))
    assert back.tolist() == items


@pytest.mark.parametrize(
    "text", ["hello", "", "a\u0000b", "caf\u00e9", "\u65e5\u672c", "\U0001f600", "\u0080\u00ff"]
)
def test_valid_utf8_reaches_the_model_as_its_text(text: str) -> None:
    strings = bytes_to_strings(_objects([text.encode("utf-8")]))
    assert strings[0] == text


def test_invalid_bytes_map_to_private_use_code_points() -> None:
    strings = bytes_to_strings(_objects([b"a\xffb\x80"]))
    assert strings[0] == "a\U0010ffffb\U0010ff80"


def test_valid_prefix_kept_as_text_around_an_invalid_byte() -> None:
    strings = bytes_to_strings(_objects(["\u00e9".encode() + b"\xff"]))
    assert strings[0] == "\u00e9\U0010ffff"


def test_model_made_text_comes_back_as_utf8() -> None:
    # An output string the model produced itself (never went through bytes_to_strings).
    back = strings_to_bytes(_objects(["r\u00e9sum\u00e9", "", "\u0000"]))
    assert back.tolist() == ["r\u00e9sum\u00e9".encode(), b"", b"\x00"]


def test_bytes_elements_in_output_are_returned_as_is() -> None:
    assert strings_to_bytes(_objects([b"\xff\x00"])).tolist() == [b"\xff\x00"]


def test_bytearray_and_memoryview_elements_accepted() -> None:
    strings = bytes_to_strings(_objects([bytearray(b"\xffx"), memoryview(b"ok")]))
    assert strings_to_bytes(strings).tolist() == [b"\xffx", b"ok"]


def test_str_elements_pass_through() -> None:
    assert bytes_to_strings(_objects(["plain"])).tolist() == ["plain"]


def test_documented_ambiguity_of_private_use_text() -> None:
    # Valid UTF-8 text carrying U+10FFFF comes back as the raw byte 0xFF (documented).
    text = "x\U0010ffff".encode("utf-8")
    assert strings_to_bytes(bytes_to_strings(_objects([text]))).tolist() == [b"x\xff"]


def test_empty_array() -> None:
    empty = np.empty((0, 2), dtype=object)
    assert bytes_to_strings(empty).shape == (0, 2)
    assert strings_to_bytes(empty).shape == (0, 2)


def test_input_array_not_modified() -> None:
    array = _objects([b"\xff"])
    bytes_to_strings(array)
    assert array[0] == b"\xff"
