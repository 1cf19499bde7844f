"""Transport-neutral inference request and response records.

The HTTP and gRPC codecs translate their wire formats to and from these; validation,
scheduling and execution see nothing else. Tensor data are numpy arrays, usually views of the
request buffer (never Python lists).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from server.protocol.datatypes import DataType
from server.protocol.shared_memory_params import SharedMemoryRef
from server.tracing.context import TraceContext

Parameters = dict[str, Any]


class ModelOutputs(dict[str, np.ndarray]):
    """A request's outputs by name, with the response parameters its model set (a Triton
    python model's ``InferenceResponse(parameters=...)``): they go back in the response."""

    def __init__(self, outputs: dict[str, np.ndarray], parameters: Parameters) -> None:
        super().__init__(outputs)
        self.parameters = parameters


def response_parameters(outputs: object) -> Parameters:
    """The response parameters a model set with ``outputs`` (none for plain outputs)."""
    return dict(outputs.parameters) if isinstance(outputs, ModelOutputs) else {}


#: ``InputTensor.data`` of an input in shared memory until the data plane reads it there.
SHARED_MEMORY_PENDING = np.empty(0, dtype=np.uint8)


@dataclass
class InputTensor:
    """A decoded input: ``data`` has the datatype's dtype and exactly ``prod(shape)`` elements."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    data: np.ndarray
    parameters: Parameters = field(default_factory=dict)
    #: the data is in this shared memory region (``data`` is filled from it by the data plane)
    shared_memory: SharedMemoryRef | None = None


@dataclass
class RequestedOutput:
    """An output the client asked for, with its per-output parameters (e.g. ``binary_data``)."""

    name: str
    parameters: Parameters = field(default_factory=dict)
    #: write the result into this shared memory region instead of the response
    shared_memory: SharedMemoryRef | None = None


@dataclass
class InferRequest:
    """One inference request; ``outputs`` is None when the client asked for every output."""

    model_name: str
    model_version: str
    inputs: list[InputTensor]
    outputs: list[RequestedOutput] | None = None
    id: str | None = None
    parameters: Parameters = field(default_factory=dict)
    #: how and when the transport received it, for the trace extension (None: an internal
    #: request, an ensemble step's)
    trace: TraceContext | None = None


@dataclass
class OutputTensor:
    """One result tensor, shaped as the client will see it."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]
    data: np.ndarray
    #: written into this region already: the response carries no data for it
    shared_memory: SharedMemoryRef | None = None


@dataclass
class InferResponse:
    """The result of one request, outputs in the order the client asked for them."""

    model_name: str
    model_version: str
    outputs: list[OutputTensor]
    id: str | None = None
    parameters: Parameters = field(default_factory=dict)
    #: returns the memory the outputs view (a front end's view of the executor's arena)
    on_release: Callable[[], None] | None = None
    #: a traced request's end, told when the transport got the response (``sent_from``)
    #: and when it had written it
    on_sent: Callable[[int, int], None] | None = None
    sent_from: int = 0

    def release(self) -> None:
        """The transport has written the response: the outputs' memory may be reused."""
        if self.on_release is not None:
            self.on_release()
            self.on_release = None
        if self.on_sent is not None:
            self.on_sent(self.sent_from, time.perf_counter_ns())
            self.on_sent = None

    @property
    def payload_bytes(self) -> int:
        """Tensor bytes the encoders will write (outputs in shared memory excluded)."""
        total = 0
        for output in self.outputs:  # a loop: no generator per response
            if output.shared_memory is None:
                total += output.data.nbytes
        return total
