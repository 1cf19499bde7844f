"""Runs an ensemble: a graph of composing models joined by named tensors.

An ensemble has no instances of its own. Each request walks the graph: every step whose input
tensors all exist is sent at once, as an internal request, to its composing model (through the
data plane's normal path, so the composing model validates, schedules, batches and counts it);
its outputs become ensemble tensors that may start more steps. Steps that do not lead to a
requested output are not run (Triton prunes them too).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from server.errors import InferenceServerError, InternalError
from server.observability.statistics import ModelStats
from server.scheduling.job import Job


@dataclass(frozen=True)
class EnsembleStep:
    """One step: the composing model and version ("" = its newest ready one), and its maps
    (composing model tensor -> ensemble tensor) for inputs and outputs."""

    model_name: str
    model_version: str
    input_map: Mapping[str, str]
    output_map: Mapping[str, str]


@dataclass(frozen=True)
class StepResult:
    """A composing model's outputs for one step and the compute durations (input, infer,
    output) its own statistics recorded for that request: the ensemble adds them up."""

    outputs: Mapping[str, np.ndarray]
    compute_input_ns: int = 0
    compute_infer_ns: int = 0
    compute_output_ns: int = 0


class StepRunner(Protocol):
    """Sends one internal request to a composing model (the data plane does it)."""

    async def __call__(
        self,
        model_name: str,
        model_version: str,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        request_id: str,
        parameters: Mapping[str, Any],
    ) -> StepResult: ...


@dataclass(frozen=True)
class EnsemblePlan:
    """The validated graph of one ensemble; ``max_inflight`` (Triton's
    ``max_inflight_requests``) caps how many requests each step runs at once (0: no cap)."""

    name: str
    steps: tuple[EnsembleStep, ...]
    max_inflight: int = 0

    def needed_steps(self, outputs: Sequence[str]) -> list[EnsembleStep]:
        """The steps that lead to ``outputs``, in config order (walked back from them)."""
        producer = {
            tensor: index
            for index, step in enumerate(self.steps)
            for tensor in step.output_map.values()
        }
        needed: set[int] = set()
        wanted = list(outputs)
        while wanted:
            index = producer.get(wanted.pop())
            if index is None or index in needed:
                continue
            needed.add(index)
            wanted.extend(self.steps[index].input_map.values())
        return [self.steps[i] for i in sorted(needed)]


class EnsembleScheduler:
    """The ``Scheduler`` of an ensemble version: runs its graph for each request."""

    takes_device_arrays = False

    def __init__(self, plan: EnsemblePlan, runner: StepRunner, stats: ModelStats) -> None:
        self._plan = plan
        self._runner = runner
        self._stats = stats
        #: per step, shared by every request of this ensemble version
        self._inflight = {
            id(step): asyncio.Semaphore(plan.max_inflight) for step in plan.steps
        } if plan.max_inflight > 0 else {}

    @property
    def pending(self) -> int:
        return 0  # requests wait in the composing models' queues, not here

    async def ready(self) -> bool:
        return True

    def close(self, wait: bool = True) -> None:
        """Nothing to release: the composing models are served on their own."""

    async def aclose(self) -> None:
        """Nothing to release (see ``close``)."""

    async def execute(self, job: Job) -> dict[str, np.ndarray]:
        """Run the steps for ``job``; fill its times with the composing models' summed
        compute durations and count one execution of ``max(1, rows)`` (Triton's)."""
        start = time.perf_counter_ns()
        tensors: dict[str, Any] = dict(job.inputs)
        waiting = self._plan.needed_steps(job.output_names)
        running: dict[asyncio.Task[StepResult], EnsembleStep] = {}
        totals = [0, 0, 0]
        first_dispatch: int | None = None
        try:
            while True:
                for step in [s for s in waiting if all(t in tensors for t in s.input_map.values())]:
                    waiting.remove(step)
                    running[asyncio.ensure_future(self._run(step, tensors, job))] = step
                    if first_dispatch is None:
                        first_dispatch = time.perf_counter_ns()
                if not running:
                    break
                done, _ = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    step = running.pop(task)
                    result = task.result()  # a failed step fails the request
                    for name, tensor in step.output_map.items():
                        if name in result.outputs:
                            tensors[tensor] = result.outputs[name]
                    totals[0] += result.compute_input_ns
                    totals[1] += result.compute_infer_ns
                    totals[2] += result.compute_output_ns
        except BaseException:
            for task in running:
                task.cancel()
            raise
        missing = [name for name in job.output_names if name not in tensors]
        if missing:
            raise InternalError(
                f"in ensemble '{self._plan.name}', unexpected deadlock, at least one output is "
                "not set while no more ensemble steps can be made"
            )
        job.times.queue_ns = (first_dispatch or start) - start
        job.times.compute_ns = totals[1]
        job.times.breakdown = (totals[0], totals[1], totals[2])
        self._stats.record_execution(max(1, job.rows), *totals)
        return {name: tensors[name] for name in job.output_names}

    async def _run(self, step: EnsembleStep, tensors: Mapping[str, Any], job: Job) -> StepResult:
        inputs = {name: tensors[tensor] for name, tensor in step.input_map.items()}
        parameters = {
            k: v for k, v in job.parameters.items() if k not in ("priority", "timeout")
        }
        limit = self._inflight.get(id(step))
        try:
            if limit is None:
                return await self._runner(
                    step.model_name, step.model_version, inputs, list(step.output_map),
                    job.request_id, parameters,
                )
            async with limit:
                return await self._runner(
                    step.model_name, step.model_version, inputs, list(step.output_map),
                    job.request_id, parameters,
                )
        except InferenceServerError as exc:
            raise _prefixed(exc, self._plan.name) from exc


def _prefixed(error: InferenceServerError, ensemble: str) -> InferenceServerError:
    """The composing model's error, same kind, with Triton's ``in ensemble '<e>', `` prefix."""
    return type(error)(f"in ensemble '{ensemble}', {error.message}")
