"""Runs executions on a model instance: on its worker thread, or inline when that is cheaper.

Each instance has one worker thread (ONNX Runtime releases the GIL while it runs), so a slow
model never stalls the event loop. Handing an execution to a thread and back costs about
0.2-0.3 ms of CPU on our 2-core machines (executor queue, thread wake-up, GIL hand-over,
loop wake-up), while small models run in 10 µs. So the runner times every execution and, once
a model has shown that it runs in well under that cost, runs it on the event loop; if it slows
down, the timings send it back to the thread.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from backends.base import ModelInstance

#: Executions averaging less than this run on the event loop (seconds).
INLINE_BELOW_S = 100e-6
_WARMUP_RUNS = 8  # timed runs on the thread before inline execution is considered
_SMOOTHING = 0.1  # weight of the newest timing in the moving average


class InstanceRunner:
    """One model instance with its worker thread and a moving average of its run time."""

    def __init__(self, name: str, instance: ModelInstance) -> None:
        self.instance = instance
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self._average_s: float | None = None
        self._runs = 0

    @property
    def runs_inline(self) -> bool:
        return (
            self._runs >= _WARMUP_RUNS
            and self._average_s is not None
            and self._average_s < INLINE_BELOW_S
        )

    async def run(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Execute once; the caller guarantees no other execution uses this instance."""
        if self.runs_inline:
            return self._timed(inputs, output_names)
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._thread, self._timed, inputs, output_names)

    def _timed(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        start = time.perf_counter()
        try:
            return self.instance.execute(inputs, output_names)
        finally:
            self._record(time.perf_counter() - start)

    def _record(self, seconds: float) -> None:
        self._runs += 1
        previous = self._average_s
        self._average_s = (
            seconds if previous is None else previous + _SMOOTHING * (seconds - previous)
        )

    def close(self) -> None:
        """Stop the worker thread (after its current work) and release the instance."""
        self._thread.shutdown(wait=True)
        self.instance.close()
