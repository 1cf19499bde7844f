"""The direct scheduler: each request runs alone on the next free model instance.

Every instance has its own worker thread (ONNX Runtime releases the GIL while it runs), so the
event loop never computes. Free instances wait in a queue; a request takes one, runs on its
thread, and hands it back.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from backends.base import ModelInstance


class DirectScheduler:
    """Runs requests one by one on whichever of the model's instances is free."""

    def __init__(self, name: str, instances: Sequence[ModelInstance]) -> None:
        self._instances = list(instances)
        self._threads = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-{index}")
            for index in range(len(self._instances))
        ]
        self._free: asyncio.Queue[int] | None = None

    def _free_queue(self) -> asyncio.Queue[int]:
        # Created on first use so that it belongs to the serving event loop.
        if self._free is None:
            self._free = asyncio.Queue()
            for index in range(len(self._instances)):
                self._free.put_nowait(index)
        return self._free

    async def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run one request on a free instance and return its outputs."""
        free = self._free_queue()
        index = await free.get()
        try:
            loop = asyncio.get_running_loop()
            instance = self._instances[index]
            return await loop.run_in_executor(
                self._threads[index], instance.execute, inputs, output_names
            )
        finally:
            free.put_nowait(index)

    def close(self) -> None:
        """Stop the worker threads (after their current work) and release the instances."""
        for thread in self._threads:
            thread.shutdown(wait=True)
        for instance in self._instances:
            instance.close()
