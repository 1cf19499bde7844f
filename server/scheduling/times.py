"""Where a request's time went inside a scheduler, for the statistics extension."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExecutionTimes:
    """Filled by a scheduler: nanoseconds waiting for an instance, and running on it."""

    queue_ns: int = 0
    compute_ns: int = 0
