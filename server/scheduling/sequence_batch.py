"""What one execution of the sequence batcher runs: which requests, and their inputs.

Each request of a sequence gets the control tensors Triton's sequence batcher gives it (START
on its first request, END on its last, READY on every real one, CORRID its sequence's id) and
its sequence's implicit state; an empty slot below the highest busy one (Direct strategy) is
filled with a "null" request: zeros shaped like a real request's inputs, READY false, no
sequence. Each tensor is one element (one row) per slot, as in Triton.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from server.protocol.sequence_spec import SequenceId, SequenceSpec
from server.scheduling.job import Job
from server.scheduling.layout import BatchLayout


@dataclass(eq=False)
class SequenceRequest:
    """A request of a sequence, waiting in its sequence's queue or running."""

    job: Job
    start: bool
    end: bool
    enqueued: float  # clock seconds
    enqueued_ns: int  # perf counter, for the statistics
    result: asyncio.Future[dict[str, np.ndarray]]
    #: set once the execution that took this request is done with its inputs
    released: asyncio.Event = field(default_factory=asyncio.Event)
    #: the job the instance ran for it (controls and state added); None until it is taken
    ran: Job | None = None


@dataclass(eq=False)
class Sequence:
    """One live (or draining) sequence: its queued requests, slot and implicit state."""

    id: SequenceId
    last_seen: float
    requests: deque[SequenceRequest] = field(default_factory=deque)
    slot: Slot | None = None
    #: its id still routes requests here (False once its END arrived or it expired)
    open: bool = True
    running: bool = False
    states: dict[str, np.ndarray] | None = None
    #: in the backlog: when it is given up (the earliest request ``timeout`` of its requests)
    expires: float | None = None


@dataclass(eq=False)
class Slot:
    """One batch slot of one instance (Direct), or one candidate sequence place (Oldest)."""

    instance: int
    index: int
    sequence: Sequence | None = None


#: One entry of an execution: a sequence and its request, or None for a null request.
Entry = tuple[Sequence, SequenceRequest] | None


def choose_direct(
    spec: SequenceSpec, layout: BatchLayout, slots: list[Slot], now: float
) -> tuple[list[Entry] | None, float | None]:
    """The Direct strategy's next batch from one instance's slots: every slot up to the
    highest whose sequence has a request waiting (the others null), or None and how long to
    wait for a fuller batch (``max_queue_delay_microseconds``, ``minimum_slot_utilization``)."""
    heads = [
        (slot.sequence, slot.sequence.requests[0])
        for slot in slots
        if slot.sequence is not None and slot.sequence.requests
    ]
    if not heads:
        return None, None
    delay = spec.max_queue_delay_us / 1e6
    if delay and spec.minimum_slot_utilization:
        waited = now - min(request.enqueued for _, request in heads)
        if waited < delay and len(heads) / len(slots) < spec.minimum_slot_utilization:
            return None, delay - waited
    key = layout.shape_key(heads[0][1].job)
    chosen = {
        sequence.slot.index: (sequence, request)
        for sequence, request in heads
        if sequence.slot is not None and layout.shape_key(request.job) == key
    }
    return [chosen.get(index) for index in range(max(chosen) + 1)], None


def choose_oldest(
    spec: SequenceSpec, layout: BatchLayout, slots: list[Slot], now: float
) -> tuple[list[Entry] | None, float | None]:
    """The Oldest strategy's next batch: the next requests of the candidate sequences, oldest
    first, of the oldest one's shapes, up to ``max_batch_size`` (cut to a preferred size),
    once the batch is full or the oldest has waited ``max_queue_delay_microseconds``."""
    heads = sorted(
        (
            (slot.sequence, slot.sequence.requests[0])
            for slot in slots
            if slot.sequence is not None and slot.sequence.requests
        ),
        key=lambda head: head[1].enqueued,
    )
    if not heads:
        return None, None
    key = layout.shape_key(heads[0][1].job)
    batch: list[Entry] = [h for h in heads if layout.shape_key(h[1].job) == key]
    batch = batch[: spec.max_batch_size]
    largest = max(spec.preferred_sizes, default=spec.max_batch_size)
    delay = spec.max_queue_delay_us / 1e6
    waited = now - heads[0][1].enqueued
    if len(batch) < largest and delay and waited < delay:
        return None, delay - waited
    fitting = [size for size in spec.preferred_sizes if size <= len(batch)]
    return batch[: max(fitting)] if fitting else batch, None


def run_job(spec: SequenceSpec, sequence: Sequence, request: SequenceRequest) -> Job:
    """The job an instance runs for ``request``: its inputs, its controls and its sequence's
    state (zeros at START), asking for its outputs and the state outputs."""
    job = request.job
    inputs = dict(job.inputs)
    inputs.update(controls(spec, request.start, request.end, True, sequence.id))
    if spec.states:
        if request.start or sequence.states is None:
            sequence.states = {s.input_name: s.initial(spec.batching) for s in spec.states}
        inputs.update(sequence.states)
    names = [*job.output_names, *(n for n in spec.state_outputs if n not in job.output_names)]
    return Job(
        inputs, names, job.rows, request_id=job.request_id, parameters=job.parameters,
        respond=job.respond,
    )


def null_job(spec: SequenceSpec, template: Job) -> Job:
    """A null request for an empty slot: ``template``'s inputs zeroed, READY false."""
    inputs = {
        name: np.full(array.shape, b"", dtype=object)
        if array.dtype == object
        else np.zeros(array.shape, dtype=array.dtype)
        for name, array in template.inputs.items()
    }
    none: SequenceId = "" if spec.corrid is not None and spec.corrid.datatype.is_bytes else 0
    inputs.update(controls(spec, False, False, False, none))
    for state in spec.states:
        inputs[state.input_name] = state.initial(spec.batching)
    return Job(inputs, template.output_names, template.rows)


def controls(
    spec: SequenceSpec, start: bool, end: bool, ready: bool, sequence_id: SequenceId
) -> dict[str, np.ndarray]:
    """The control tensors of one request (or of a null request: all false, id 0)."""
    tensors: dict[str, np.ndarray] = {}
    for control, flag in ((spec.start, start), (spec.end, end), (spec.ready, ready)):
        if control is not None:
            tensors[control.name] = control.tensor(flag, spec.batching)
    if spec.corrid is not None:
        tensors[spec.corrid.name] = spec.corrid.tensor(sequence_id, spec.batching)
    return tensors
