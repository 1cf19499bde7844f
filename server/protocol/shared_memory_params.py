"""The tensor parameters that put a tensor in a client's shared memory region (both protocols).

``shared_memory_region`` names a registered region; ``shared_memory_byte_size`` (required)
and ``shared_memory_offset`` (default 0) say where in it. HTTP carries them as JSON, gRPC as
``string_param`` / ``int64_param``: both arrive here as Python values and are checked alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.errors import InvalidArgument

REGION = "shared_memory_region"
OFFSET = "shared_memory_offset"
BYTE_SIZE = "shared_memory_byte_size"
KEYS = (REGION, OFFSET, BYTE_SIZE)


@dataclass(frozen=True)
class SharedMemoryRef:
    """Where a tensor's bytes are: ``byte_size`` bytes at ``offset`` of region ``region``."""

    region: str
    offset: int
    byte_size: int


def shared_memory_ref(params: dict[str, Any], what: str) -> SharedMemoryRef | None:
    """The tensor's region reference, None when it has none; 400 on malformed parameters."""
    if not params or (REGION not in params and OFFSET not in params and BYTE_SIZE not in params):
        return None
    region = params.get(REGION)
    if not isinstance(region, str) or not region:
        raise InvalidArgument(f"'{REGION}' of {what} must be a non-empty string")
    if BYTE_SIZE not in params:
        raise InvalidArgument(f"'{BYTE_SIZE}' is required with '{REGION}' for {what}")
    values = []
    for key, default in ((OFFSET, 0), (BYTE_SIZE, None)):
        value = params.get(key, default)
        if type(value) is not int or value < 0:
            raise InvalidArgument(f"Unable to parse '{key}' of {what}: expected a non-negative integer")
        values.append(value)
    return SharedMemoryRef(region, values[0], values[1])
