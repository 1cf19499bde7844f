"""Triton's dynamic batcher (triton-facts §4.1), between the protocol layer and the instances.

Requests wait in one queue per priority level (1 is the highest; arrival order within a level).
Whenever an instance is free, a batch is formed from whole requests taken in order, counted in
rows (the leading dimension), never split, up to ``max_batch_size``; the walk stops at the first
request whose non-batch shapes differ from the batch's. With ``max_queue_delay_microseconds``
0 the pending batch goes at once; otherwise it goes when it reaches the largest preferred size
it can, or when its oldest request has waited the delay. Queue policies bound each level
(``max_queue_size``) and time requests out (REJECT fails them, DELAY moves them behind the
fresh ones). How a batch's inputs are gathered and its outputs split (rows, or Triton's ragged
inputs, batch inputs and batch outputs) is the model's ``BatchLayout``. Delays shorter than
``SPIN_BELOW_S`` are waited precisely (``_yield_until``); longer ones may overshoot by up to a
millisecond, the resolution of the event loop's timers.

All batching state lives on the event loop; only model execution runs on instance threads.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from backends.base import ModelInstance
from server.errors import InternalError, InvalidArgument, Rejected, Unavailable
from server.generated import model_config_pb2 as mc
from server.observability.statistics import ModelStats
from server.scheduling.job import Job
from server.scheduling.layout import BatchLayout, ShapeKey
from server.scheduling.runner import (
    SMALL_REQUEST_BYTES,
    InstanceRunner,
    Runners,
    consume,
    request_bytes,
    wait_released,
)

log = logging.getLogger(__name__)

Clock = Callable[[], float]  # seconds, monotonic
#: Waits shorter than this are yielded away (``_yield_until``), longer ones use a loop timer.
SPIN_BELOW_S = 0.5e-3


@dataclass(frozen=True)
class QueuePolicy:
    """One priority level's policy (ModelQueuePolicy)."""

    max_queue_size: int = 0  # 0 = unbounded
    timeout_us: int = 0  # 0 = no timeout
    allow_timeout_override: bool = False
    delay_on_timeout: bool = False  # timeout_action DELAY (else REJECT)

    @classmethod
    def from_config(cls, policy: mc.ModelQueuePolicy) -> QueuePolicy:
        return cls(
            max_queue_size=policy.max_queue_size,
            timeout_us=policy.default_timeout_microseconds,
            allow_timeout_override=policy.allow_timeout_override,
            delay_on_timeout=policy.timeout_action == mc.ModelQueuePolicy.DELAY,
        )


#: A level without a policy of its own (made once: a frozen dataclass costs 0.5 µs to make).
_NO_POLICY = QueuePolicy()


@dataclass(frozen=True)
class BatchingPolicy:
    """The ``dynamic_batching`` settings the batcher works by."""

    max_batch_size: int
    preferred_sizes: tuple[int, ...] = ()
    max_queue_delay_us: int = 0
    preserve_ordering: bool = False
    priority_levels: int = 1
    default_priority: int = 1
    policies: dict[int, QueuePolicy] = field(default_factory=dict)

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> BatchingPolicy:
        batching = config.dynamic_batching
        levels = max(1, batching.priority_levels)
        default = batching.default_priority_level
        default_policy = QueuePolicy.from_config(batching.default_queue_policy)
        policies = {level: default_policy for level in range(1, levels + 1)}
        for level, policy in batching.priority_queue_policy.items():
            policies[int(level)] = QueuePolicy.from_config(policy)
        return cls(
            max_batch_size=max(1, config.max_batch_size),
            preferred_sizes=tuple(sorted(set(batching.preferred_batch_size))),
            max_queue_delay_us=batching.max_queue_delay_microseconds,
            preserve_ordering=batching.preserve_ordering,
            priority_levels=levels,
            default_priority=default if 1 <= default <= levels else 1,
            policies=policies,
        )


@dataclass(eq=False)
class _Pending:
    """A queued request and what the batcher needs to know of it."""

    job: Job
    level: int
    shape_key: ShapeKey
    enqueued: float  # clock seconds, for the queue delay
    enqueued_ns: int  # perf counter, for the statistics
    deadline: float | None  # when a queue timeout expires (clock seconds)
    delay_on_timeout: bool
    result: asyncio.Future[dict[str, np.ndarray]]
    #: set once the batch that took this request has finished with its inputs
    released: asyncio.Event = field(default_factory=asyncio.Event)
    dispatched: bool = False
    #: preserve_ordering: the answer, held until every earlier request has been answered
    outcome: tuple[dict[str, np.ndarray] | None, BaseException | None] | None = None


class DynamicBatcher(Runners):
    """Forms batches for one model version and runs them on its instances."""

    def __init__(
        self,
        name: str,
        instances: Sequence[ModelInstance],
        policy: BatchingPolicy,
        stats: ModelStats | None = None,
        clock: Clock = time.monotonic,
        layout: BatchLayout | None = None,
        model: str | None = None,
    ) -> None:
        """``name`` labels threads and logs ("<model>-<version>"); ``model`` is the model's
        name as clients know it, for their error messages (default: ``name``)."""
        self._name = name
        self._model = model or name
        self._policy = policy
        self._layout = layout or BatchLayout()
        self._stats = stats
        self._clock = clock
        self._runners = [
            InstanceRunner(f"{name}-{index}", instance) for index, instance in enumerate(instances)
        ]
        self.takes_device_arrays = all(instance.joins_on_device for instance in instances)
        self._free: list[InstanceRunner] = list(self._runners)
        self._queues: dict[int, deque[_Pending]] = {
            level: deque() for level in range(1, policy.priority_levels + 1)
        }
        self._delayed: dict[int, deque[_Pending]] = {
            level: deque() for level in range(1, policy.priority_levels + 1)
        }
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._released_in_order: deque[_Pending] = deque()
        self._buffers: dict[int, dict[str, np.ndarray]] = {}
        self._running: set[asyncio.Task[None]] = set()

    # --- the public side -----------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Requests waiting in the queues (not yet in a batch)."""
        return sum(len(q) for q in self._queues.values()) + sum(
            len(q) for q in self._delayed.values()
        )

    async def execute(self, job: Job) -> dict[str, np.ndarray]:
        """Queue one request, wait for its batch to run, and return its rows of the outputs.

        A caller cancelled while its request waits takes it out of the queue (it never runs);
        cancelled once its batch has started, it waits until the batch is done with its inputs.
        """
        pending = self._enqueue(job)
        try:
            # Not shielded: a cancellation cancels the result future too, and every answer
            # is set only on a result that is not done yet.
            return await pending.result
        except asyncio.CancelledError:
            if not pending.dispatched:
                self._remove(pending)
            else:
                pending.job.cancelled = True  # a model taking requests one by one may look
                # Nobody will read the answer; an error stored in it is not "unretrieved".
                pending.result.add_done_callback(consume)
                await wait_released(pending.released)
            raise

    def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
        for pending in self._all_queued():
            if not pending.result.done():
                pending.result.set_exception(Unavailable(f"model '{self._model}' was unloaded"))

    # --- queueing --------------------------------------------------------------------------

    def _enqueue(self, job: Job) -> _Pending:
        policy = self._policy
        # 0, or a level the model does not have, means the default level (as Triton).
        level = (
            job.priority
            if 1 <= job.priority <= policy.priority_levels
            else (policy.default_priority)
        )
        queue_policy = policy.policies.get(level, _NO_POLICY)
        queued = len(self._queues[level]) + len(self._delayed[level])
        if queue_policy.max_queue_size and queued >= queue_policy.max_queue_size:
            raise Rejected(
                f"inference request for model '{self._model}' was rejected: Exceeds maximum "
                "queue size"
            )
        timeout_us = queue_policy.timeout_us
        # With the override allowed, the request's timeout may only shorten the policy's.
        if (
            job.timeout_us
            and queue_policy.allow_timeout_override
            and (not timeout_us or job.timeout_us < timeout_us)
        ):
            timeout_us = job.timeout_us
        loop = self._start()
        # The statistics' stamp first, then the delay's: a pause between them (a collection,
        # the thread preempted) can then only make the counted queue time longer than the
        # delay waited, never shorter. (The other way round, with shape_key between them, a
        # CI run under load counted 152 us of queue time for a 700 us delay.)
        enqueued_ns = time.perf_counter_ns()
        now = self._clock()
        pending = _Pending(
            job=job,
            level=level,
            shape_key=self._layout.shape_key(job),
            enqueued=now,
            enqueued_ns=enqueued_ns,
            deadline=now + timeout_us / 1e6 if timeout_us else None,
            delay_on_timeout=queue_policy.delay_on_timeout,
            result=loop.create_future(),
        )
        self._queues[level].append(pending)
        if self._policy.preserve_ordering:
            self._released_in_order.append(pending)
        self._notify()
        return pending

    def _remove(self, pending: _Pending) -> None:
        for queues in (self._queues, self._delayed):
            try:
                queues[pending.level].remove(pending)
            except ValueError:
                continue
        if pending in self._released_in_order:
            self._released_in_order.remove(pending)
            self._release_in_order()

    def _all_queued(self) -> list[_Pending]:
        return [p for q in (*self._queues.values(), *self._delayed.values()) for p in q]

    def _start(self) -> asyncio.AbstractEventLoop:
        """Start the batching task if it is not running; the loop it runs on (the task's:
        looking the running loop up is a system call, see ``eager``)."""
        if self._task is None or self._task.done():
            self._wake = asyncio.Event()
            self._task = asyncio.create_task(self._loop(), name=f"batcher-{self._name}")
        return self._task.get_loop()

    def _notify(self) -> None:
        if self._wake is not None:
            self._wake.set()

    # --- batch formation -------------------------------------------------------------------

    async def _loop(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            try:
                wait_s = self._dispatch_ready()
            except Exception as exc:
                log.exception("batcher of '%s' failed; failing its queued requests", self._name)
                for pending in self._all_queued():
                    self._remove(pending)
                    self._fail(pending, InternalError(f"batcher failed: {exc}"))
                wait_s = None
            if wait_s is None:
                await self._wake.wait()
            elif wait_s < SPIN_BELOW_S:
                await _yield_until(self._wake, wait_s)
            else:
                try:
                    await asyncio.wait_for(self._wake.wait(), wait_s)
                except TimeoutError:
                    pass

    def _dispatch_ready(self) -> float | None:
        """Send every batch that is ready to free instances; how long until the next one
        may be (None: only a new request or a free instance can change that)."""
        while True:
            now = self._clock()
            next_wait = self._expire(now)
            if not self._free:
                return next_wait
            batch, wait = self._form(now)
            if batch is None:
                return _earliest(next_wait, wait)
            self._dispatch(batch)

    def _expire(self, now: float) -> float | None:
        """Apply queue timeouts; the time until the next one."""
        nearest: float | None = None
        for level, queue in self._queues.items():
            for pending in list(queue):
                if pending.deadline is None:
                    continue
                if pending.deadline <= now:
                    queue.remove(pending)
                    if pending.delay_on_timeout:
                        pending.deadline = None
                        self._delayed[level].append(pending)
                    else:
                        self._fail(pending, Rejected("Request timeout expired"))
                else:
                    nearest = _earliest(nearest, pending.deadline - now)
        return nearest

    def _candidates(self) -> list[_Pending]:
        """Queued requests in the order batches take them: by priority level, fresh requests
        before delayed ones, arrival order within each."""
        order: list[_Pending] = []
        for level in sorted(self._queues):
            order.extend(self._queues[level])
            order.extend(self._delayed[level])
        return order

    def _form(self, now: float) -> tuple[list[_Pending] | None, float | None]:
        """The batch to send now, or None and how long until the oldest request's delay ends.

        As Triton's GetDynamicBatch: requests are added in order while they fit
        ``max_batch_size`` and share the batch's shapes. The batch goes at once, cut to the
        largest preferred size it reached (or to where the next request would pass the
        largest preferred size), unless a non-zero delay has expired; otherwise it goes whole
        when it cannot grow, has reached the largest preferred size, or waits no more.
        """
        candidates = self._candidates()
        if not candidates:
            return None, None
        policy = self._policy
        max_preferred = max(policy.preferred_sizes, default=policy.max_batch_size)
        batch: list[_Pending] = []
        rows = 0
        best_preferred = 0  # batch length at the largest preferred size reached
        cut = 0  # batch length where the next request would pass the largest preferred size
        stopped = False  # the next request cannot join: the batch cannot grow
        for pending in candidates:
            if pending.job.rows > policy.max_batch_size:  # validation refuses these first
                self._remove(pending)
                self._fail(pending, InvalidArgument("request is larger than max_batch_size"))
                continue
            if batch and (
                pending.shape_key != batch[0].shape_key
                or rows + pending.job.rows > policy.max_batch_size
            ):
                stopped = True
                break
            if batch and not best_preferred and not cut and rows + pending.job.rows > max_preferred:
                cut = len(batch)
            batch.append(pending)
            rows += pending.job.rows
            if rows in policy.preferred_sizes:
                best_preferred = len(batch)
        if not batch:
            return None, None
        delay = policy.max_queue_delay_us / 1e6
        waited = now - min(p.enqueued for p in candidates)  # the oldest in the whole queue
        expired = delay > 0 and waited >= delay
        prefix = best_preferred or cut
        if prefix and not expired:
            return batch[:prefix], None
        if stopped or rows >= max_preferred or expired or delay == 0:
            return batch, None
        return None, delay - waited

    # --- execution -------------------------------------------------------------------------

    def _dispatch(self, batch: list[_Pending]) -> None:
        runner = self._free.pop()
        started = time.perf_counter_ns()
        for pending in batch:
            queue = self._queues[pending.level]
            (queue if pending in queue else self._delayed[pending.level]).remove(pending)
            pending.dispatched = True
            pending.job.times.queue_ns = started - pending.enqueued_ns
        assert self._task is not None  # (a batch is only formed by the running task)
        task = self._task.get_loop().create_task(self._run(runner, batch, started))
        self._running.add(task)  # the loop keeps only weak references to tasks
        task.add_done_callback(self._running.discard)

    async def _run(self, runner: InstanceRunner, batch: list[_Pending], started: int) -> None:
        rows = sum(p.job.rows for p in batch)
        jobs = [p.job for p in batch]
        try:
            buffers = self._buffers.setdefault(id(runner), {})
            names = _union_outputs(batch)
            if runner.instance.takes_requests:  # one request object each, answered each
                results = await runner.run_requests(jobs)
                computed = time.perf_counter_ns() - started
                for pending, result in zip(batch, results, strict=True):
                    pending.job.times.compute_ns = computed
                    if isinstance(result, Exception):
                        self._fail(pending, result)
                    else:
                        self._succeed(pending, result)
                if self._stats is not None:
                    self._stats.record_execution(rows, 0, computed, 0)
                return
            # A request batched alone may have its outputs written where it wants them.
            memory = jobs[0].memory if len(jobs) == 1 and self._layout.plain else None
            if runner.instance.joins_on_device:  # each request's rows copied to the device
                outputs = await runner.run_parts(self._layout.gather_parts(jobs), names, memory)
            elif sum(request_bytes(job.inputs) for job in jobs) > SMALL_REQUEST_BYTES:
                # Gathering a large batch copies as many bytes as it holds: on the instance's
                # thread with the execution, not on the loop.
                outputs = await runner.run_batch(
                    lambda: self._layout.gather(jobs, buffers),
                    names,
                    lambda produced: _unaliased(produced, buffers),
                    memory,
                )
            else:
                inputs = self._layout.gather(jobs, buffers)
                outputs = _unaliased(await runner.run(inputs, names, memory), buffers)
            computed = time.perf_counter_ns() - started
            answers = self._layout.scatter(self._model, jobs, outputs)
            for pending, answer in zip(batch, answers):
                pending.job.times.compute_ns = computed
                self._succeed(pending, answer)
            if self._stats is not None:
                self._stats.record_execution(rows, 0, computed, 0)
        except Exception as exc:  # noqa: BLE001 - a model fault fails every request of the batch
            for pending in batch:
                self._fail(pending, exc)
        finally:
            for pending in batch:
                pending.released.set()
            self._free.append(runner)
            self._notify()

    def _succeed(self, pending: _Pending, outputs: dict[str, np.ndarray]) -> None:
        if self._policy.preserve_ordering:
            pending.outcome = (outputs, None)
            self._release_in_order()
        elif not pending.result.done():
            pending.result.set_result(outputs)

    def _fail(self, pending: _Pending, error: BaseException) -> None:
        if self._policy.preserve_ordering and pending in self._released_in_order:
            pending.outcome = (None, error)
            self._release_in_order()
        elif not pending.result.done():
            pending.result.set_exception(error)

    def _release_in_order(self) -> None:
        """preserve_ordering: answers go out in arrival order."""
        while self._released_in_order and self._released_in_order[0].outcome is not None:
            pending = self._released_in_order.popleft()
            assert pending.outcome is not None
            outputs, error = pending.outcome
            if pending.result.done():
                continue
            if error is not None or outputs is None:
                pending.result.set_exception(error or InternalError("no outputs"))
            else:
                pending.result.set_result(outputs)


async def _yield_until(wake: asyncio.Event, seconds: float) -> None:
    """Wait a short time precisely: yield to the event loop until it has passed or ``wake`` is
    set. The loop's own timers go through epoll, whose timeout is whole milliseconds, so a
    100 µs queue delay would last over a millisecond. The loop keeps serving other callbacks
    meanwhile; the CPU this burns is at most the wait itself, which is why only waits under
    ``SPIN_BELOW_S`` are spent this way (longer ones overshoot by up to a millisecond)."""
    end = time.perf_counter() + seconds
    while not wake.is_set() and time.perf_counter() < end:
        await asyncio.sleep(0)


def _earliest(a: float | None, b: float | None) -> float | None:
    if a is None:
        return b
    if b is None:
        return a
    return min(a, b)


def _unaliased(
    outputs: dict[str, np.ndarray], buffers: Mapping[str, np.ndarray]
) -> dict[str, np.ndarray]:
    """Copy any output that shares memory with a reused gather buffer: that buffer is refilled
    by the instance's next batch while these answers may still be being written."""
    if not buffers:
        return outputs
    return {
        name: (
            value.copy() if any(np.may_share_memory(value, b) for b in buffers.values()) else value
        )
        for name, value in outputs.items()
    }


def _union_outputs(batch: list[_Pending]) -> list[str]:
    names: list[str] = []
    for pending in batch:
        for name in pending.job.output_names:
            if name not in names:
                names.append(name)
    return names
