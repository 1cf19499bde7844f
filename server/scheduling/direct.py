"""The direct scheduler: each request runs alone on the next free model instance.

Free instances wait in a queue; a request takes one, runs on it (see ``runner`` for where the
execution happens), and hands it back, so every instance serves and none is used twice at once.
"""

from __future__ import annotations

import asyncio
import time
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
        self._free: asyncio.Queue[InstanceRunner] | None = None
        self._waiting = 0

    @property
    def pending(self) -> int:
        """Requests waiting for a free instance."""
        return self._waiting

    def _free_queue(self) -> asyncio.Queue[InstanceRunner]:
        # Created on first use so that it belongs to the serving event loop.
        if self._free is None:
            self._free = asyncio.Queue()
            for runner in self._runners:
                self._free.put_nowait(runner)
        return self._free

    async def execute(self, job: Job) -> dict[str, np.ndarray]:
        """Run one request on a free instance and return its outputs; ``job.times``
        receives how long it waited for the instance and how long it ran."""
        free = self._free_queue()
        queued = time.perf_counter_ns()
        self._waiting += 1
        try:
            runner = await free.get()
        finally:
            self._waiting -= 1
        started = time.perf_counter_ns()
        try:
            if runner.instance.takes_requests:  # a request object for the model to answer
                (answer,) = await runner.run_requests([job])
                if isinstance(answer, Exception):
                    raise answer
                outputs = answer
            elif self._layout.plain:
                outputs = await runner.run(job.inputs, job.output_names)
            else:  # ragged inputs flattened, batch inputs added, batch outputs shaped
                inputs = self._layout.gather([job], {})
                produced = await runner.run(inputs, job.output_names)
                (outputs,) = self._layout.scatter(self._model, [job], produced)
        except asyncio.CancelledError:
            # The runner returns only once the execution is over: it ran, for nobody.
            self._record(job, started)
            raise
        finally:
            free.put_nowait(runner)
            job.times.queue_ns = started - queued
        self._record(job, started)
        return outputs

    def _record(self, job: Job, started: int) -> None:
        job.times.compute_ns = time.perf_counter_ns() - started
        if self._stats is not None:
            self._stats.record_execution(job.rows, 0, job.times.compute_ns, 0)
