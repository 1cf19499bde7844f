"""Request parameters both transports check the same way (triton-facts §2.3).

``priority`` is a non-negative integer and ``timeout`` an integer number of microseconds; keys
starting with ``triton_`` are Triton's own and refused, except those a transport allows (the C++
gRPC client sends ``triton_enable_empty_final_response`` on every request). The sequence
extension's ``sequence_id`` is an unsigned 64-bit integer or a string (0 and "" mean "not in a
sequence"), ``sequence_start`` and ``sequence_end`` are booleans.
"""

from __future__ import annotations

from collections.abc import Container, Mapping
from typing import Any

from server.errors import InvalidArgument

RESERVED_PREFIX = "triton_"
_UINT64_MAX = (1 << 64) - 1
SEQUENCE_FLAGS = ("sequence_start", "sequence_end")


def check_request_parameters(params: dict[str, Any], allowed_reserved: Container[str] = ()) -> None:
    """Refuse reserved keys and wrongly typed scheduling parameters."""
    for key, value in params.items():
        if key.startswith(RESERVED_PREFIX) and key not in allowed_reserved:
            raise InvalidArgument(
                "parameter keys starting with 'triton_' are reserved for Triton usage and should "
                "not be specified."
            )
        if key in ("priority", "timeout") and (type(value) is not int or value < 0):
            raise InvalidArgument(
                f"Unable to parse '{key}': expected a non-negative integer, got {value!r}"
            )
        if key == "sequence_id" and not (
            isinstance(value, str) or (type(value) is int and 0 <= value <= _UINT64_MAX)
        ):
            raise InvalidArgument("Unable to parse 'sequence_id'")
        if key in SEQUENCE_FLAGS and type(value) is not bool:
            raise InvalidArgument(f"Unable to parse '{key}'")


def sequence_of(params: Mapping[str, Any]) -> tuple[int | str, bool, bool]:
    """A checked request's sequence id (0 when none), START and END flags."""
    return (
        params.get("sequence_id", 0),
        params.get("sequence_start", False) is True,
        params.get("sequence_end", False) is True,
    )
