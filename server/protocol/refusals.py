"""Refusals Triton's core makes while it checks a request name the request first.

Its texts for a wrong input (datatype, shape, batch size, byte size, a missing or repeated
tensor, a raw body it cannot deduce) begin ``[request id: <id>] ``, ``<id_unknown>`` for a
request without one; clients match these texts whole, so they are built here, in one place.
"""

from __future__ import annotations

from server.errors import InvalidArgument


def request_refused(request_id: str | None, text: str) -> InvalidArgument:
    """``text`` as Triton's core says it of the request ``request_id`` (None or empty: none)."""
    return InvalidArgument(f"[request id: {request_id or '<id_unknown>'}] {text}")
