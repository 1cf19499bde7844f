"""What a transport knows of a request that a trace needs: how it came (``HTTP`` or
``GRPC``), when its receiving started and ended, and the W3C ``traceparent`` it carried.

Taking it costs two clock reads and a header lookup, so transports take it for every
request; whether the request is traced is decided by the data plane (one check when tracing
is off). Times are ``time.perf_counter_ns()``: the monotonic clock, the same in every process
of the server (Triton's traces use the steady clock too).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: A W3C trace context ``traceparent``: version 00, 32 + 16 hex digits, flags.
_TRACEPARENT = re.compile(r"^00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")


@dataclass(slots=True)
class TraceContext:
    protocol: str  # "HTTP" or "GRPC", the prefix of its receive and send timestamps
    recv_start: int
    recv_end: int
    traceparent: str = ""

    def as_tuple(self) -> tuple[str, int, int, str]:
        """The form it crosses the process boundary in (``server.ipc.messages.Infer``)."""
        return (self.protocol, self.recv_start, self.recv_end, self.traceparent)


def parent_ids(traceparent: str) -> tuple[int, int, int] | None:
    """A valid ``traceparent``'s (trace id, span id, flags); None when absent or malformed
    (all-zero ids are invalid too, as the W3C text says)."""
    found = _TRACEPARENT.match(traceparent.strip().lower()) if traceparent else None
    if found is None:
        return None
    trace_id, span_id = int(found.group(1), 16), int(found.group(2), 16)
    if trace_id == 0 or span_id == 0:
        return None
    return trace_id, span_id, int(found.group(3), 16)
