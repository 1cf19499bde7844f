"""Where a request's time went inside a scheduler, for the statistics extension."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class ExecutionTimes:
    """Filled by a scheduler: nanoseconds waiting for an instance, and running on it."""

    queue_ns: int = 0
    compute_ns: int = 0
    #: compute input, infer and output durations when the scheduler knows them apart (an
    #: ensemble: the sums over its composing models); None lets the data plane measure them
    breakdown: tuple[int, int, int] | None = None
