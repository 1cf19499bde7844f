"""One traced request: its identity, its timestamps (Triton's activity names, in the order
they happened) and, at the TENSORS level, its input and output tensors. The data plane
fills it; ``finish`` hands it to its setting's writer once the transport has sent the
response."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from server.tracing.context import TraceContext


@dataclass
class TracedTensor:
    """``TENSOR_QUEUE_INPUT`` (an input as the request brought it) or
    ``TENSOR_BACKEND_OUTPUT`` (an output as the model made it)."""

    activity: str
    name: str
    datatype: str
    data: np.ndarray


@dataclass
class Trace:
    id: int
    model_name: str
    model_version: int
    request_id: str
    context: TraceContext
    level: frozenset[str]
    #: (name, ns) of the data plane's activities: REQUEST_START ... REQUEST_END
    timestamps: list[tuple[str, int]] = field(default_factory=list)
    tensors: list[TracedTensor] = field(default_factory=list)
    #: the writer of the setting that sampled it (set by ``TraceManager``; None for a child,
    #: written with its parent)
    sink: Callable[[Trace, int, int], None] | None = None
    #: the trace of the ensemble request this one is a step of (0: none)
    parent_id: int = 0
    #: the traces of its ensemble steps, in the order they started
    children: list[Trace] = field(default_factory=list)

    @property
    def wants_tensors(self) -> bool:
        return "TENSORS" in self.level

    def stamp(self, name: str, ns: int) -> None:
        self.timestamps.append((name, ns))

    def tensor(self, activity: str, name: str, datatype: str, data: np.ndarray) -> None:
        if self.wants_tensors:
            self.tensors.append(TracedTensor(activity, name, datatype, data))

    def finish(self, send_start: int, send_end: int) -> None:
        """The response is written (0, 0: it never was, the request failed or its client
        went away): write the trace out, once."""
        sink, self.sink = self.sink, None
        if sink is not None:
            sink(self, send_start, send_end)

    def front_end_stamps(self, send_start: int, send_end: int) -> tuple[
        list[tuple[str, int]], list[tuple[str, int]]
    ]:
        """The transport's timestamps: receiving (before the data plane's), sending
        (after)."""
        prefix = self.context.protocol
        received = "WAITREAD" if prefix == "GRPC" else "RECV"
        before = [
            (f"{prefix}_{received}_START", self.context.recv_start),
            (f"{prefix}_{received}_END", self.context.recv_end),
        ]
        after = []
        if send_start:
            after = [(f"{prefix}_SEND_START", send_start), (f"{prefix}_SEND_END", send_end)]
        return before, after
