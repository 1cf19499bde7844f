"""DirectScheduler: every instance serves, none is used by two requests at once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from backends.base import ModelInstance
from server.errors import InternalError
from server.scheduling.direct import DirectScheduler
from server.scheduling.job import Job
from server.scheduling.layout import BatchLayout, ScatterOutput


class CountingInstance(ModelInstance):
    """Tracks how many executions overlap on it; doubles its input."""

    def __init__(self) -> None:
        self.active = 0
        self.most_active = 0
        self.calls = 0
        self._lock = threading.Lock()

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        with self._lock:
            self.active += 1
            self.calls += 1
            self.most_active = max(self.most_active, self.active)
        time.sleep(0.005)  # slow enough to stay on the worker threads
        with self._lock:
            self.active -= 1
        return {"y": inputs["x"] * 2}


def test_requests_spread_over_instances_without_overlap() -> None:
    instances = [CountingInstance(), CountingInstance()]
    scheduler = DirectScheduler("m", instances)

    async def main() -> list[dict[str, np.ndarray]]:
        return await asyncio.gather(
            *(scheduler.execute(Job({"x": np.full(4, i)}, ["y"])) for i in range(20))
        )

    results = asyncio.run(main())
    for i, result in enumerate(results):  # each request got its own answer
        np.testing.assert_array_equal(result["y"], np.full(4, 2 * i))
    assert all(instance.most_active == 1 for instance in instances)
    assert all(instance.calls > 0 for instance in instances)
    assert sum(instance.calls for instance in instances) == 20
    scheduler.close()


def test_a_model_fault_names_the_model_as_clients_know_it() -> None:
    """The scheduler is labelled <model>-<version> for its threads; errors name the model."""

    class Short(ModelInstance):
        def execute(
            self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
        ) -> dict[str, np.ndarray]:
            return {"y": np.zeros(1)}  # a scattered output the source input does not match

    layout = BatchLayout(
        ragged=frozenset({"x"}), scatter_outputs={"y": ScatterOutput(source="x", dims=(-1,))}
    )
    scheduler = DirectScheduler("m-1", [Short()], layout=layout, model="m")
    with pytest.raises(InternalError, match="^model 'm' returned output 'y' with 1 elements"):
        asyncio.run(scheduler.execute(Job({"x": np.ones((1, 3))}, ["y"])))
    scheduler.close()
