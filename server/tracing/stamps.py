"""What the data plane records of a traced request: Triton's activity timestamps and, at the
TENSORS level, its tensors; and how its trace ends (once the transport has sent the response,
``InferResponse.on_sent``; an ensemble step's is written with its parent)."""

from __future__ import annotations

import time

import numpy as np

from server.protocol.types import InferRequest, InferResponse
from server.scheduling.times import ExecutionTimes
from server.tracing.record import Trace


def success(
    trace: Trace,
    request: InferRequest,
    response: InferResponse,
    times: ExecutionTimes,
    compute: tuple[int, int, int],
    moments: tuple[int, int, int, int],
    computes: bool,
) -> None:
    """An answered request. ``moments``: its start, queueing, answer made, end; the compute
    timestamps come from the durations the scheduler measured (``compute``: input, infer,
    output as the statistics count them); none for an ensemble, whose steps compute."""
    start, queued_at, finished, done = moments
    points = [("REQUEST_START", start), ("QUEUE_START", queued_at)]
    if computes:
        computing = queued_at + times.queue_ns
        input_end = computing + (compute[0] if times.breakdown else 0)
        output_start = input_end + times.compute_ns
        compute_end = output_start + (compute[2] if times.breakdown else 0)
        points += [
            ("COMPUTE_START", computing), ("COMPUTE_INPUT_END", input_end),
            ("COMPUTE_OUTPUT_START", output_start), ("COMPUTE_END", compute_end),
        ]
    points += [("INFER_RESPONSE_COMPLETE", finished), ("REQUEST_END", done)]
    for name, ns in points:
        trace.stamp(name, ns)
    if trace.wants_tensors:
        for tensor in request.inputs:
            if type(tensor.data) is np.ndarray:
                trace.tensor("TENSOR_QUEUE_INPUT", tensor.name, tensor.datatype.name, tensor.data)
        for output in response.outputs:
            if type(output.data) is np.ndarray:
                trace.tensor(
                    "TENSOR_BACKEND_OUTPUT", output.name, output.datatype.name, output.data
                )
    _end_when_sent(trace, response)


def cache_hit(trace: Trace, response: InferResponse, start: int, prepared_at: int) -> None:
    """A response cache hit (looked up from ``prepared_at``): no queue, no compute."""
    trace.stamp("REQUEST_START", start)
    trace.stamp("QUEUE_START", prepared_at)
    trace.stamp("REQUEST_END", time.perf_counter_ns())
    _end_when_sent(trace, response)


def failure(trace: Trace | None, start: int) -> None:
    """A failed request's trace is written as it stands: nothing was sent."""
    if trace is not None:
        trace.stamp("REQUEST_START", start)
        trace.stamp("REQUEST_END", time.perf_counter_ns())
        trace.finish(0, 0)


def _end_when_sent(trace: Trace, response: InferResponse) -> None:
    if not trace.parent_id:
        response.on_sent = trace.finish
        response.sent_from = time.perf_counter_ns()
