"""Triton's sequence batcher (``sequence_batching``, triton-features §2.1).

Every request names its sequence (``sequence_id``; START on the first, END on the last). A new
sequence takes a free slot: Direct has ``max_batch_size`` slots per instance (1 without
batching), Oldest ``max_candidate_sequences``; free slots are taken lowest index first, so
sequences spread over the instances. Without a free slot a sequence waits in the backlog, in
arrival order, for the next slot to be freed. Each instance runs one execution at a time,
formed from its slots (``sequence_batch``), so a sequence has at most one request running and
its requests run in arrival order. A slot is freed once its sequence's END has run, or once
the sequence was idle (no new request) longer than ``max_sequence_idle_microseconds``; later
requests of an expired sequence are refused like those of an unknown one. A backlogged
sequence whose requests carry a ``timeout`` is given up when the earliest one expires: all its
requests fail with Triton's UNAVAILABLE.

All state lives on the event loop; only model execution runs on the instances' threads.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import time
from collections import deque
from collections.abc import Sequence as Seq

import numpy as np

from backends.base import ModelInstance
from server.errors import InternalError, InvalidArgument, Rejected, Unavailable
from server.observability.statistics import ModelStats
from server.protocol.parameters import sequence_of
from server.protocol.sequence_spec import SequenceId, SequenceSpec
from server.scheduling.batcher import Clock
from server.scheduling.job import Job
from server.scheduling.layout import BatchLayout
from server.scheduling.runner import (
    SMALL_REQUEST_BYTES,
    InstanceRunner,
    Runners,
    consume,
    request_bytes,
    wait_released,
)
from server.scheduling.sequence_batch import (
    Entry,
    Sequence,
    SequenceRequest,
    Slot,
    choose_direct,
    choose_oldest,
    null_job,
    run_job,
)

log = logging.getLogger(__name__)


class SequenceBatcher(Runners):
    """Schedules the sequences of one model version on its instances."""

    def __init__(
        self,
        name: str,
        instances: Seq[ModelInstance],
        spec: SequenceSpec,
        stats: ModelStats | None = None,
        clock: Clock = time.monotonic,
        layout: BatchLayout | None = None,
        model: str | None = None,
    ) -> None:
        """``name`` labels threads ("<model>-<version>"); ``model`` is the model's name as
        clients know it, for their error messages (default: ``name``)."""
        self._name = name
        self._model = model or name
        self._spec = spec
        self._stats = stats
        self._clock = clock
        self._layout = layout or BatchLayout()
        self._runners = [
            InstanceRunner(f"{name}-{index}", instance) for index, instance in enumerate(instances)
        ]
        # Control tensors are host arrays joined on the host: no device inputs.
        self.takes_device_arrays = False
        per_instance = spec.max_candidate_sequences if spec.oldest else spec.max_batch_size
        self._slots = [
            [Slot(instance, index) for index in range(per_instance)]
            for instance in range(len(self._runners))
        ]
        self._free = [(slot.index, slot.instance) for slots in self._slots for slot in slots]
        heapq.heapify(self._free)
        self._live: dict[SequenceId, Sequence] = {}
        self._backlog: deque[Sequence] = deque()
        self._wakes: list[asyncio.Event] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._reaper_wake: asyncio.Event | None = None
        self._closed = False

    # --- the public side -----------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Requests waiting to run, in slots and in the backlog."""
        sequences = [s.sequence for slots in self._slots for s in slots if s.sequence]
        return sum(len(s.requests) for s in (*sequences, *self._backlog))

    async def execute(self, job: Job) -> dict[str, np.ndarray]:
        """Queue a request in its sequence, wait until it has run, and return its outputs.

        A caller cancelled while its request waits takes it out of the queue (it never runs);
        cancelled once it runs, it waits until the execution is done with its inputs.
        """
        request = self._enqueue(job)
        try:
            return await asyncio.shield(request.result)
        except asyncio.CancelledError:
            if request.ran is None:
                self._withdraw(request)
            else:
                job.cancelled = request.ran.cancelled = True
                request.result.add_done_callback(consume)
                await wait_released(request.released)
            raise

    def _stop(self) -> None:
        self._closed = True
        for task in self._tasks:
            task.cancel()
        sequences = [s.sequence for slots in self._slots for s in slots if s.sequence]
        for sequence in (*sequences, *self._backlog):
            for request in sequence.requests:
                if not request.result.done():
                    request.result.set_exception(
                        Unavailable(f"model '{self._model}' was unloaded")
                    )
            sequence.requests.clear()

    # --- admission -------------------------------------------------------------------------

    def _enqueue(self, job: Job) -> SequenceRequest:
        spec, model = self._spec, self._model
        sequence_id, start, end = sequence_of(job.parameters)
        if job.rows > 1:
            raise InvalidArgument(
                f"inference request to model '{model}' must specify batch-size 1 due to "
                "requirements of sequence batcher"
            )
        if sequence_id in (0, ""):
            raise InvalidArgument(
                f"inference request to model '{model}' must specify a non-zero or non-empty "
                "correlation ID"
            )
        if spec.corrid is not None:
            problem = spec.corrid.error(sequence_id)
            if problem is not None:
                raise InvalidArgument(f"inference request to model '{model}': {problem}")
        sequence = self._live.get(sequence_id)
        if sequence is None and not start:
            raise InvalidArgument(
                f"inference request for sequence {sequence_id} to model '{model}' must specify "
                "the START flag on the first request of the sequence"
            )
        if self._closed:
            raise Unavailable(f"model '{model}' was unloaded")
        if sequence is not None and start:
            log.warning(
                "sequence %s for model '%s' has a conflict. The previous sequence did not end "
                "before this sequence start. Previous sequence will be terminated early.",
                sequence_id, model,
            )
        now = self._clock()
        request = SequenceRequest(
            job, start, end, now, time.perf_counter_ns(),
            asyncio.get_running_loop().create_future(),
        )
        if sequence is None:
            sequence = self._live[sequence_id] = Sequence(sequence_id, now)
            self._place(sequence)
        sequence.requests.append(request)
        sequence.last_seen = now
        if sequence.slot is None and job.timeout_us:
            expires = now + job.timeout_us / 1e6
            sequence.expires = expires if sequence.expires is None else min(sequence.expires, expires)
        if end:  # a later request with this id starts a new sequence
            sequence.open = False
            del self._live[sequence_id]
        self._start()
        if sequence.slot is not None:
            self._wakes[sequence.slot.instance].set()
        elif sequence.expires is not None and self._reaper_wake is not None:
            self._reaper_wake.set()
        return request

    def _place(self, sequence: Sequence) -> None:
        """Give a new sequence a free slot, or put it in the backlog."""
        if self._free:
            index, instance = heapq.heappop(self._free)
            self._assign(self._slots[instance][index], sequence)
        else:
            self._backlog.append(sequence)

    def _assign(self, slot: Slot, sequence: Sequence) -> None:
        slot.sequence, sequence.slot, sequence.expires = sequence, slot, None
        if self._wakes:
            self._wakes[slot.instance].set()

    def _withdraw(self, request: SequenceRequest) -> None:
        """A request whose client gave up before it ran leaves its sequence's queue."""
        for sequence in self._sequences():
            if request in sequence.requests:
                sequence.requests.remove(request)
                self._settle(sequence)
                return

    def _sequences(self) -> list[Sequence]:
        slotted = [s.sequence for slots in self._slots for s in slots if s.sequence]
        return [*slotted, *self._backlog]

    def _settle(self, sequence: Sequence) -> None:
        """Free the slot (or backlog place) of a sequence that is over: its END has run or
        it expired, and nothing of it is queued or running. The oldest backlogged sequence
        takes the freed slot."""
        if sequence.open or sequence.running or sequence.requests:
            return
        slot = sequence.slot
        if slot is None:
            if sequence in self._backlog:
                self._backlog.remove(sequence)
            return
        slot.sequence, sequence.slot = None, None
        if self._backlog:
            self._assign(slot, self._backlog.popleft())
        else:
            heapq.heappush(self._free, (slot.index, slot.instance))

    # --- the instances' loops and the reaper -----------------------------------------------

    def _start(self) -> None:
        if self._tasks:
            return
        self._wakes = [asyncio.Event() for _ in self._runners]
        self._reaper_wake = asyncio.Event()
        self._tasks = [
            asyncio.create_task(self._serve(index), name=f"sequence-{self._name}-{index}")
            for index in range(len(self._runners))
        ]
        self._tasks.append(asyncio.create_task(self._reap(), name=f"reaper-{self._name}"))

    async def _serve(self, instance: int) -> None:
        wake = self._wakes[instance]
        choose = choose_oldest if self._spec.oldest else choose_direct
        while True:
            wake.clear()
            entries, wait_s = choose(self._spec, self._layout, self._slots[instance], self._clock())
            if entries is None:
                if wait_s is None:
                    await wake.wait()
                else:
                    try:
                        await asyncio.wait_for(wake.wait(), wait_s)
                    except TimeoutError:
                        pass
                continue
            await self._run(instance, entries)

    async def _reap(self) -> None:
        """Expire sequences that hold a slot and had no request for the idle time (those in
        the backlog are kept, as in Triton), and give up backlogged ones past their timeout."""
        assert self._reaper_wake is not None
        idle_s = self._spec.idle_us / 1e6
        while True:
            self._reaper_wake.clear()
            now = self._clock()
            wait_s = idle_s
            for sequence_id, sequence in list(self._live.items()):
                if sequence.slot is None:
                    continue
                left = sequence.last_seen + idle_s - now
                if left > 0:
                    wait_s = min(wait_s, left)
                    continue
                log.info(
                    "sequence %s of model '%s' was idle for more than %d us: its slot is "
                    "released", sequence_id, self._model, self._spec.idle_us,
                )
                del self._live[sequence_id]
                sequence.open = False
                self._settle(sequence)
            for sequence in list(self._backlog):
                if sequence.expires is None:
                    continue
                if sequence.expires > now:
                    wait_s = min(wait_s, sequence.expires - now)
                    continue
                self._give_up(sequence)
            try:
                await asyncio.wait_for(self._reaper_wake.wait(), wait_s)
            except TimeoutError:
                pass

    def _give_up(self, sequence: Sequence) -> None:
        """A backlogged sequence past its requests' timeout: each of them fails."""
        self._backlog.remove(sequence)
        if self._live.get(sequence.id) is sequence:
            del self._live[sequence.id]
        sequence.open = False
        for request in sequence.requests:
            _fail(request, Rejected("timeout of the corresponding sequence has been expired"))
        sequence.requests.clear()

    # --- execution -------------------------------------------------------------------------

    async def _run(self, instance: int, entries: list[Entry]) -> None:
        """Run one execution; every request in it gets its outputs or the error."""
        spec = self._spec
        started = time.perf_counter_ns()
        taken = [entry for entry in entries if entry is not None]
        for sequence, request in taken:
            sequence.requests.popleft()
            sequence.running = True
            request.job.times.queue_ns = started - request.enqueued_ns
        try:
            for sequence, request in taken:
                request.ran = run_job(spec, sequence, request)
            template = taken[0][1].ran
            assert template is not None
            jobs = [
                null_job(spec, template) if entry is None else entry[1].ran or template
                for entry in entries
            ]
            answers = await self._execute(self._runners[instance], jobs, taken)
            computed = time.perf_counter_ns() - started
            for (sequence, request), answer in zip(taken, answers, strict=True):
                request.job.times.compute_ns = computed
                if isinstance(answer, Exception):
                    _fail(request, answer)
                    continue
                if request.job.respond is not None:  # decoupled: answered through respond
                    request.result.set_result({})
                    continue
                if spec.states:
                    sequence.states = {
                        s.input_name: np.array(answer[s.output_name]) for s in spec.states
                    }
                if not request.result.done():
                    request.result.set_result(
                        {name: answer[name] for name in request.job.output_names}
                    )
            if self._stats is not None:  # null requests count in the batch (not sent to
                # an instance that takes requests one by one)
                requests_only = self._runners[instance].instance.takes_requests
                self._stats.record_execution(
                    len(taken) if requests_only else len(jobs), 0, computed, 0
                )
        except Exception as exc:  # noqa: BLE001 - a model fault fails every request of the batch
            for _, request in taken:
                _fail(request, exc)
        finally:  # (also when the loop is cancelled by a forced stop meanwhile)
            for sequence, request in taken:
                _fail(request, Unavailable(f"model '{self._model}' was unloaded"))
                request.released.set()
                sequence.running = False
                self._settle(sequence)

    async def _execute(
        self, runner: InstanceRunner, jobs: list[Job], taken: list[tuple[Sequence, SequenceRequest]]
    ) -> list[dict[str, np.ndarray] | Exception]:
        """Each taken request's outputs (state outputs included), or its own error."""
        names: list[str] = []
        for job in jobs:
            names.extend(n for n in job.output_names if n not in names)
        if runner.instance.takes_requests:  # answered request by request: no null requests
            real = [request.ran for _, request in taken if request.ran is not None]
            return list(await runner.run_requests(real))
        buffers: dict[str, np.ndarray] = {}  # fresh: the answers are views of them
        if sum(request_bytes(job.inputs) for job in jobs) > SMALL_REQUEST_BYTES:
            outputs = await runner.run_batch(
                lambda: self._layout.gather(jobs, buffers), names, lambda produced: produced
            )
        else:
            outputs = await runner.run(self._layout.gather(jobs, buffers), names)
        answers = self._layout.scatter(self._model, jobs, outputs)
        real_answers: list[dict[str, np.ndarray] | Exception] = [
            answer for answer, job in zip(answers, jobs, strict=True)
            if any(request.ran is job for _, request in taken)
        ]
        return real_answers


def _fail(request: SequenceRequest, error: BaseException) -> None:
    if not request.result.done():
        request.result.set_exception(
            error if isinstance(error, Exception) else InternalError(str(error))
        )
