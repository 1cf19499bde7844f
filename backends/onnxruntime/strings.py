"""BYTES <-> ONNX Runtime strings, byte for byte.

ONNX Runtime's Python API only carries strings as ``str`` (bytes objects are ``str()``-ed,
lone surrogates refused). Valid UTF-8 elements reach the model as the text they are. Each byte
of an element that is not valid UTF-8 is mapped to one private-use code point,
U+10FF80 + (byte - 0x80), the same idea as Python's surrogateescape but with code points ONNX
Runtime accepts; the way back undoes it from the output string alone.

The one ambiguity: an element whose *valid* UTF-8 text contains U+10FF80..U+10FFFF comes back
with those characters turned into the raw bytes 0x80..0xFF. Those code points are private-use
(the last two are noncharacters), so real text does not carry them.
"""

from __future__ import annotations

import numpy as np

_SURROGATE_TO_PRIVATE = {0xDC00 + b: chr(0x10FF00 + b) for b in range(0x80, 0x100)}
_PRIVATE_TO_SURROGATE = {0x10FF00 + b: chr(0xDC00 + b) for b in range(0x80, 0x100)}
# UTF-8 prefixes of U+10FF80..U+10FFBF and U+10FFC0..U+10FFFF
_PRIVATE_PREFIXES = (b"\xf4\x8f\xbe", b"\xf4\x8f\xbf")


def _to_text(item: object) -> str:
    if not isinstance(item, (bytes, bytearray, memoryview)):
        return str(item)
    data = bytes(item)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", "surrogateescape").translate(_SURROGATE_TO_PRIVATE)


def _to_bytes(item: object) -> bytes:
    if isinstance(item, bytes):
        return item
    data = str(item).encode("utf-8")
    if _PRIVATE_PREFIXES[0] in data or _PRIVATE_PREFIXES[1] in data:
        text = str(item).translate(_PRIVATE_TO_SURROGATE)
        return text.encode("utf-8", "surrogateescape")
    return data


def bytes_to_strings(array: np.ndarray) -> np.ndarray:
    """A BYTES tensor (object array of bytes) as the object array of str ONNX Runtime takes."""
    out = np.empty(array.shape, dtype=object)
    out.reshape(-1)[:] = [_to_text(item) for item in array.reshape(-1)]
    return out


def strings_to_bytes(array: np.ndarray) -> np.ndarray:
    """An ONNX Runtime string output as a BYTES tensor (object array of bytes)."""
    out = np.empty(array.shape, dtype=object)
    out.reshape(-1)[:] = [_to_bytes(item) for item in array.reshape(-1)]
    return out
