"""Request parameters both transports check the same way (triton-facts §2.3).

``priority`` is a non-negative integer and ``timeout`` an integer number of microseconds; keys
starting with ``triton_`` are Triton's own and refused, except those a transport allows (the C++
gRPC client sends ``triton_enable_empty_final_response`` on every request).
"""

from __future__ import annotations

from collections.abc import Container
from typing import Any

from server.errors import InvalidArgument

RESERVED_PREFIX = "triton_"


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
