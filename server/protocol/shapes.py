"""Shape arithmetic with Python ints, so absurd client shapes give a 400, never an overflow."""

from __future__ import annotations

import math

import numpy as np

from server.errors import InvalidArgument


def element_count(shape: tuple[int, ...]) -> int:
    """prod(shape), exact (numpy's int64 product would wrap around; ``math.prod`` of Python
    ints does not)."""
    return math.prod(shape)


def reshape(array: np.ndarray, shape: tuple[int, ...], name: str) -> np.ndarray:
    """``array.reshape(shape)``; a 400 naming the input when numpy cannot address the shape
    (zero-sized tensors may still declare dims beyond numpy's limits)."""
    try:
        return array.reshape(shape)
    except (ValueError, OverflowError):
        raise InvalidArgument(
            f"shape {list(shape)} of input '{name}' causes total element count to exceed "
            "maximum size"
        ) from None
