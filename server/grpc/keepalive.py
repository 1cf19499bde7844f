"""tritonserver's gRPC keepalive flags, applied as grpc core applies them on a server connection.

- Pings a client sends: each one sooner than the allowed interval after the previous one is a
  strike; past ``max_ping_strikes`` (0: no limit) the connection is closed with GOAWAY
  ENHANCE_YOUR_CALM "too_many_pings". The interval is
  ``min_recv_ping_interval_without_data_ms``, or 2 hours while the connection has no call and
  ``permit_without_calls`` is off. Sending headers or data to the client forgives its strikes.
- Pings the server sends: every ``time_ms`` (with calls open, or always with
  ``permit_without_calls``), at most ``max_pings_without_data`` (0: no limit) in a row without
  data sent between them; a ping unanswered for ``timeout_ms`` closes the connection.
- ``max_connection_age_ms``: a connection that old (less up to 10 %, so that a fleet's
  connections do not all go at once) is sent GOAWAY NO_ERROR; ``max_connection_age_grace_ms``
  later it is closed, calls still open or not.
"""

from __future__ import annotations

import random

from server.settings import GrpcKeepalive

#: The interval between a client's pings while it has no call, without permit_without_calls.
IDLE_PING_INTERVAL_S = 2 * 3600.0
_AGE_JITTER = 0.1


class PingPolicy:
    """Judges the pings a client sends."""

    def __init__(self, keepalive: GrpcKeepalive) -> None:
        self._keepalive = keepalive
        self._last: float | None = None
        self._strikes = 0

    def forgive(self) -> None:
        """The server sent headers or data."""
        self._last = None
        self._strikes = 0

    def too_many(self, now: float, idle: bool) -> bool:
        """A ping arrived at ``now`` (``idle``: no call open): whether the connection must go."""
        keepalive = self._keepalive
        if idle and not keepalive.permit_without_calls:
            interval = IDLE_PING_INTERVAL_S
        else:
            interval = keepalive.min_recv_ping_interval_without_data_ms / 1000
        last, self._last = self._last, now
        if last is None or last + interval <= now:
            return False
        self._strikes += 1
        return keepalive.max_ping_strikes != 0 and self._strikes > keepalive.max_ping_strikes


class KeepalivePings:
    """When the server pings a client, and whether it may."""

    def __init__(self, keepalive: GrpcKeepalive) -> None:
        self._keepalive = keepalive
        self._without_data = 0

    @property
    def interval_s(self) -> float:
        return self._keepalive.time_ms / 1000

    @property
    def timeout_s(self) -> float:
        return self._keepalive.timeout_ms / 1000

    def data_sent(self) -> None:
        self._without_data = 0

    def may_ping(self, idle: bool) -> bool:
        """Whether a keepalive ping is due now (and count it)."""
        keepalive = self._keepalive
        if idle and not keepalive.permit_without_calls:
            return False
        limit = keepalive.max_pings_without_data
        if limit and self._without_data >= limit:
            return False
        self._without_data += 1
        return True


def connection_age_s(keepalive: GrpcKeepalive) -> float | None:
    """How long this connection may live before GOAWAY (None: for ever)."""
    if keepalive.max_connection_age_ms is None:
        return None
    return keepalive.max_connection_age_ms / 1000 * (1 - _AGE_JITTER * random.random())


def connection_age_grace_s(keepalive: GrpcKeepalive) -> float | None:
    """How long after that GOAWAY the connection is closed (None: not before its calls end)."""
    if keepalive.max_connection_age_grace_ms is None:
        return None
    return keepalive.max_connection_age_grace_ms / 1000
