"""Inference on a decoupled model: one request, a stream of replies ending at the final flag.

The request is validated and scheduled as any other (queue, instances, statistics), but its
job carries a response sink: the model's thread hands each response to it, and it is passed
onto the event loop, where the replies are yielded in the order sent. The scheduler's own
answer only matters when it fails before the model could answer (a full queue, say): then
that error ends the stream. A stream given up by its client marks the job cancelled, which the
model sees (``is_cancelled``).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from server.errors import InferenceServerError, InternalError, InvalidArgument, failure_reason
from server.protocol import classification, datatypes
from server.protocol.model_spec import ModelSpec, TensorSpec
from server.protocol.streaming import StreamReply
from server.protocol.types import InferRequest, InferResponse, OutputTensor, response_parameters
from server.protocol.validation import validate
from server.repository.loader import ModelVersion
from server.scheduling.job import Job

RequestResult = dict[str, np.ndarray] | InferenceServerError
Shaper = Callable[[np.ndarray, TensorSpec, bool, int], np.ndarray]
_Item = tuple[RequestResult | BaseException | None, bool]


async def replies(
    served: ModelVersion, spec: ModelSpec, request: InferRequest, client_shape: Shaper
) -> AsyncIterator[StreamReply]:
    """The replies of ``served`` (a decoupled model's version) to ``request``."""
    if any(t.shared_memory for t in request.inputs) or any(
        o.shared_memory for o in request.outputs or ()
    ):
        raise InvalidArgument(
            f"shared memory is not supported for decoupled model '{spec.name}' yet"
        )
    scheduler = served.scheduler
    if scheduler is None:
        raise InternalError("model version is not fully loaded")
    start = time.perf_counter_ns()
    prepared = validate(request, spec)
    loop = asyncio.get_running_loop()
    items: asyncio.Queue[_Item] = asyncio.Queue()

    def respond(result: RequestResult | None, final: bool) -> None:  # any thread
        # (a model still sending once the server has stopped its loop: nobody to tell)
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(items.put_nowait, (result, final))

    job = Job(
        prepared.inputs, prepared.output_names, rows=prepared.batch_size,
        priority=request.parameters.get("priority", 0),
        timeout_us=request.parameters.get("timeout"), request_id=request.id or "",
        parameters=request.parameters, respond=respond,
    )

    def failed(task: asyncio.Future[Any]) -> None:
        if not task.cancelled() and task.exception() is not None:
            items.put_nowait((task.exception(), True))

    ended = False
    result: RequestResult | BaseException | None = None
    with served.gate.admit():
        task = asyncio.ensure_future(scheduler.execute(job))
        task.add_done_callback(failed)
        try:
            while not ended:
                result, ended = await items.get()
                if ended:  # counted before the client can see the end (and ask for statistics)
                    _count(served, job, start, result, prepared.batch_size)
                yield _reply(result, ended, served, spec, prepared.output_names, request,
                             prepared.batch_size, client_shape)
        finally:
            if not task.done():
                if not ended:
                    job.cancelled = True
                    task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.shield(task)
            if not ended:
                served.stats.record_failure(time.perf_counter_ns() - start, "CANCELED")


def _count(
    served: ModelVersion,
    job: Job,
    start: int,
    result: RequestResult | BaseException | None,
    batch_size: int,
) -> None:
    """Count the request in the version's statistics as its stream ends: the model may still
    be returning from its execution, so its compute time is what has passed since it began."""
    elapsed = time.perf_counter_ns() - start
    if isinstance(result, Exception):  # the stream ended with an error
        served.stats.record_failure(elapsed, failure_reason(result))
        return
    compute = job.times.compute_ns or max(0, elapsed - job.times.queue_ns)
    served.stats.record_success(elapsed, job.times.queue_ns, 0, compute, 0, batch_size)


def _reply(
    result: RequestResult | BaseException | None,
    final: bool,
    served: ModelVersion,
    spec: ModelSpec,
    names: list[str],
    request: InferRequest,
    rows: int,
    client_shape: Shaper,
) -> StreamReply:
    if result is None:
        return StreamReply(final=final, model_version=str(served.version))
    if isinstance(result, BaseException):
        error = (
            result if isinstance(result, InferenceServerError)
            else InternalError(f"model '{spec.name}' version {served.version} failed: {result}")
        )
        return StreamReply(error=error, final=final, model_version=str(served.version))
    outputs = []
    counts = classification.class_counts(request)
    for name in names:
        if name in result:
            declared = spec.outputs[name]
            data = client_shape(np.asarray(result[name]), declared, spec.batching, rows)
            datatype = datatypes.of_output(data, declared.datatype)
            output = OutputTensor(name, datatype, tuple(data.shape), data)
            outputs.append(
                classification.classify(output, counts.get(name, 0), spec.batching, declared.labels)
            )
    response = InferResponse(
        spec.name, str(served.version), outputs, request.id, response_parameters(result)
    )
    return StreamReply(response=response, final=final, model_version=str(served.version))
