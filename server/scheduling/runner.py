"""Runs executions on a model instance: on its worker thread, or inline when that is cheaper.

Each instance has one worker thread (ONNX Runtime releases the GIL while it runs), so a slow
model never stalls the event loop. Handing an execution to the thread and back costs 37-48 µs
of CPU on a quiet 2-core VM (``scripts/bench_thread_hop.py``), more under load (thread
wake-up, GIL hand-over, loop wake-up), while small models run in 10 µs. So the runner times
the executions of small requests and, once a model has shown that it runs those in well under
that cost, runs small requests on the event loop; if they slow down, the timings send them
back to the thread. Large requests (by input size) always go to the thread, whatever the
model's history.

A run timed on the thread includes its waits for the GIL (held by the busy event loop, up to
the 5 ms switch interval), so on a loaded machine every such timing looks slow and a model
that went to the thread never came back. The fastest of the recent thread runs is the one
least inflated: it decides the way back to the loop. Inline runs are wall-clock timings too,
and on a loaded machine one in a few dozen includes a preemption of milliseconds: a moving
average sent a 10 µs model back to its thread after each (a profile under perf_analyzer load
found 5 of 6 small requests on the thread). So the model leaves the loop only when most of its
recent inline runs were slow.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from backends.base import ModelInstance, RequestResult
from server.memory.output_memory import OutputMemory
from server.threads import WorkerThread

if TYPE_CHECKING:
    from server.scheduling.job import Job

log = logging.getLogger(__name__)

#: Small executions averaging less than this run on the event loop (seconds).
INLINE_BELOW_S = 100e-6
#: Only requests whose inputs total at most this many bytes count as small.
SMALL_REQUEST_BYTES = 1 << 16
_BYTES_ELEMENT_COST = 64  # BYTES elements are converted one by one: count each as this many bytes
#: A readiness check that takes longer says "not ready" (Triton's python backend waits 5 s).
READY_TIMEOUT_S = 5.0
_WARMUP_RUNS = 8  # timed small runs on the thread before inline execution is considered
INLINE_WINDOW = 16  # recent inline runs judged: the model leaves when most were slow


def request_bytes(inputs: Mapping[str, np.ndarray]) -> int:
    """The size a request is judged by: tensor bytes, BYTES elements at a fixed cost each."""
    total = 0
    for array in inputs.values():  # a loop: no generator per request
        total += array.size * _BYTES_ELEMENT_COST if array.dtype == object else array.nbytes
    return total


class InstanceRunner:
    """One model instance with its worker thread and a moving average of its small runs."""

    def __init__(self, name: str, instance: ModelInstance) -> None:
        self.instance = instance
        self._thread = WorkerThread(name)
        self._thread_runs: deque[float] = deque(maxlen=_WARMUP_RUNS)  # the latest ones
        self._inline_slow: deque[bool] = deque(maxlen=INLINE_WINDOW)  # since going inline
        self._slow_count = 0  # True entries in _inline_slow
        self._inline = False
        self._ready_check: asyncio.Future[bool] | None = None

    @property
    def small_runs_inline(self) -> bool:
        if self._inline:
            return self._slow_count * 2 <= INLINE_WINDOW
        return (
            len(self._thread_runs) == _WARMUP_RUNS and min(self._thread_runs) < INLINE_BELOW_S
        )

    async def run(
        self,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        memory: OutputMemory | None = None,
    ) -> dict[str, np.ndarray]:
        """Execute once; the caller guarantees no other execution uses this instance. A
        large request's outputs may go into ``memory``; a small one is not offered it (its
        outputs are seldom large, and the offer costs microseconds of every small request),
        except to an instance that joins on the device: a GPU takes it only for an output of
        64 KiB or more, which it copies back from the device anyway.

        If the caller is cancelled while the worker thread runs, the cancellation comes
        through once the thread is done: the inputs (views of the request buffer) and the
        instance stay in use until then.
        """
        small = request_bytes(inputs) <= SMALL_REQUEST_BYTES
        if small:
            if not self.instance.joins_on_device:
                memory = None
            if self.small_runs_inline and self.instance.may_run_inline:
                if not self._inline:
                    self._inline, self._slow_count = True, 0
                    self._inline_slow.clear()
                return self._timed(inputs, output_names, small, None)
            if self._inline:  # inline runs slowed down: judge afresh on the thread
                self._inline = False
                self._thread_runs.clear()
        return await self._thread.run(self._timed, inputs, output_names, small, memory)

    async def run_batch(
        self,
        prepare: Callable[[], Mapping[str, np.ndarray]],
        output_names: Sequence[str],
        finish: Callable[[dict[str, np.ndarray]], dict[str, np.ndarray]],
        memory: OutputMemory | None = None,
    ) -> dict[str, np.ndarray]:
        """``finish(execute(prepare()))`` on the worker thread (outputs maybe into
        ``memory``): for large batches, whose gathering and copies cost as much as running
        them. Cancellation waits as in ``run``."""

        def work() -> dict[str, np.ndarray]:
            inputs = prepare()
            if memory is None:
                return finish(self.instance.execute(inputs, output_names))
            return finish(self.instance.execute_into(inputs, output_names, memory))

        return await self._thread.run(work)

    async def run_parts(
        self,
        parts: Mapping[str, Sequence[Any]],
        output_names: Sequence[str],
        memory: OutputMemory | None = None,
    ) -> dict[str, np.ndarray]:
        """A batch joined by the instance itself (``joins_on_device``), on its worker thread:
        the host-to-device copies and the stream waits are blocking work. Its outputs may be
        copied back into ``memory``. Cancellation waits as in ``run``."""
        return await self._thread.run(self.instance.execute_parts, parts, output_names, memory)

    async def run_requests(self, jobs: Sequence[Job]) -> list[RequestResult]:
        """The jobs' requests one by one (``takes_requests``), on the worker thread. A caller
        cancelled meanwhile marks its jobs cancelled (the model may look) and waits as in
        ``run``."""

        def cancel() -> None:
            for job in jobs:
                job.cancelled = True

        requests = [job.instance_request() for job in jobs]
        return await self._thread.run(self.instance.execute_requests, requests, on_cancel=cancel)

    async def ready(self) -> bool:
        """The instance's own readiness check, off the loop and beside its executions; one
        check at a time, callers meanwhile share its answer. A check that fails or takes
        more than ``READY_TIMEOUT_S`` means not ready."""
        if type(self.instance).is_ready is ModelInstance.is_ready:
            return True  # no check of its own: no thread hop
        if self._ready_check is None:
            self._ready_check = asyncio.ensure_future(self._check_ready())
            self._ready_check.add_done_callback(self._forget_ready_check)
        return await asyncio.shield(self._ready_check)

    async def _check_ready(self) -> bool:
        loop = asyncio.get_running_loop()
        check = loop.run_in_executor(None, self.instance.is_ready)
        try:
            return await asyncio.wait_for(asyncio.shield(check), READY_TIMEOUT_S)
        except TimeoutError:
            log.warning("readiness check took more than %.0f s: not ready", READY_TIMEOUT_S)
            check.add_done_callback(consume)
            return False
        except Exception:
            log.exception("readiness check failed: not ready")
            return False

    def _forget_ready_check(self, _: asyncio.Future[bool]) -> None:
        self._ready_check = None

    def _timed(
        self,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        small: bool,
        memory: OutputMemory | None,
    ) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        try:
            if memory is None:
                return self.instance.execute(inputs, output_names)
            return self.instance.execute_into(inputs, output_names, memory)
        finally:
            if small:
                self._record(time.perf_counter() - start)

    def _record(self, seconds: float) -> None:
        if not self._inline:
            self._thread_runs.append(seconds)
            return
        slow = seconds >= INLINE_BELOW_S
        if len(self._inline_slow) == INLINE_WINDOW:
            self._slow_count -= self._inline_slow[0]
        self._inline_slow.append(slow)
        self._slow_count += slow

    def close(self, wait: bool = True) -> None:
        """Stop the worker thread and release the instance; ``wait=False`` (a forced stop)
        does not wait for an execution still running."""
        self._thread.stop(wait)
        if wait:
            self.instance.close()

    async def aclose(self) -> None:
        """Release the instance on its worker thread, then stop the thread: a slow release
        (a Python model's ``finalize``, freeing device memory) never stalls the event loop."""
        await self._thread.run(self.instance.close)
        self._thread.stop(wait=False)


def consume(future: asyncio.Future[Any]) -> None:
    """A done callback for a future nobody will read: an error stored in it is not
    "unretrieved"."""
    if not future.cancelled():
        future.exception()


async def wait_released(released: asyncio.Event) -> None:
    """Wait until a dispatched request's execution has let go of its inputs, even if cancelled
    again meanwhile: until then they must not be freed."""
    while not released.is_set():
        try:
            await released.wait()
        except asyncio.CancelledError:
            continue


class Runners:
    """Readiness and closing of a scheduler's instance runners (``self._runners``), done
    alike by every scheduler; ``_stop`` fails what it still queues, before they close."""

    _runners: list[InstanceRunner]

    def _stop(self) -> None:
        """Nothing is queued outside the runners (a scheduler that queues overrides this)."""

    async def ready(self) -> bool:
        return all(await asyncio.gather(*(runner.ready() for runner in self._runners)))

    def close(self, wait: bool = True) -> None:
        """Fail what is still queued and release the instances (see ``Scheduler.close``)."""
        self._stop()
        for runner in self._runners:
            runner.close(wait)

    async def aclose(self) -> None:
        self._stop()
        await asyncio.gather(*(runner.aclose() for runner in self._runners))
