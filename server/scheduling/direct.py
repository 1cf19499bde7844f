"""The direct scheduler: each request runs alone on the next free model instance.

Free instances wait in a queue; a request takes one, runs on it (see ``runner`` for where the
execution happens), and hands it back, so every instance serves and none is used twice at once.
Requests find no free instance wait in order of arrival. (Not an ``asyncio.Queue``: its
``get`` and ``put_nowait`` made ten calls per request, for a free instance nearly always there.)
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Sequence

import numpy as np

from backends.base import ModelInstance
from server.observability.statistics import ModelStats
from server.scheduling.job import Job
from server.scheduling.layout import BatchLayout
from server.scheduling.runner import InstanceRunner, Runners


class DirectScheduler(Runners):
    """Runs requests one by one on whichever of the model's instances is free."""

    def __init__(
        self,
        name: str,
        instances: Sequence[ModelInstance],
        stats: ModelStats | None = None,
        layout: BatchLayout | None = None,
        model: str | None = None,
    ) -> None:
        """``name`` labels threads ("<model>-<version>"); ``model`` is the model's name as
        clients know it, for their error messages (default: ``name``)."""
        self._model = model or name
        self._stats = stats
        self._layout = layout or BatchLayout()
        self._runners = [
            InstanceRunner(f"{name}-{index}", instance) for index, instance in enumerate(instances)
        ]
        self.takes_device_arrays = all(instance.joins_on_device for instance in instances)
        self._free: deque[InstanceRunner] = deque(self._runners)
        self._waiters: deque[asyncio.Future[InstanceRunner]] = deque()

    @property
    def pending(self) -> int:
        """Requests waiting for a free instance."""
        return len(self._waiters)

    async def _take(self) -> InstanceRunner:
        """The next free instance, waiting (in order of arrival) for one if none is."""
        waiter: asyncio.Future[InstanceRunner] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            return await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                # handed an instance just as the cancellation came: the next one gets it
                self._give_back(waiter.result())
            else:
                waiter.cancel()
                if waiter in self._waiters:  # (a hand-over meanwhile drops cancelled ones)
                    self._waiters.remove(waiter)
            raise

    def _give_back(self, runner: InstanceRunner) -> None:
        """To the longest waiting request, else back among the free ones."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(runner)
                return
        self._free.append(runner)

    async def execute(self, job: Job) -> dict[str, np.ndarray]:
        """Run one request on a free instance and return its outputs; ``job.times``
        receives how long it waited for the instance and how long it ran."""
        queued = time.perf_counter_ns()
        runner = self._free.popleft() if self._free else await self._take()
        started = time.perf_counter_ns()
        job.times.queue_ns = started - queued  # (known to a decoupled model's last reply)
        try:
            if runner.instance.takes_requests:  # a request object for the model to answer
                (answer,) = await runner.run_requests([job])
                if isinstance(answer, Exception):
                    raise answer
                outputs = answer
            elif self._layout.plain:
                outputs = await runner.run(job.inputs, job.output_names, job.memory)
            else:  # ragged inputs flattened, batch inputs added, batch outputs shaped
                inputs = self._layout.gather([job], {})
                produced = await runner.run(inputs, job.output_names)
                (outputs,) = self._layout.scatter(self._model, [job], produced)
        except asyncio.CancelledError:
            # The runner returns only once the execution is over: it ran, for nobody.
            self._record(job, started)
            raise
        finally:
            self._give_back(runner)
        self._record(job, started)
        return outputs

    def _record(self, job: Job, started: int) -> None:
        job.times.compute_ns = time.perf_counter_ns() - started
        if self._stats is not None:
            self._stats.record_execution(job.rows, 0, job.times.compute_ns, 0)
