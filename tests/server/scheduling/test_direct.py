"""DirectScheduler: every instance serves, none is used by two requests at once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence
from typing import cast

import numpy as np
import pytest

from backends.base import ModelInstance
from server import event_loop
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

    results = event_loop.run(main())
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
        event_loop.run(scheduler.execute(Job({"x": np.ones((1, 3))}, ["y"])))
    scheduler.close()


class GatedInstance(ModelInstance):
    """Runs (on its worker thread) once the test opens its gate; records what it ran."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.ran: list[int] = []

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        self.gate.wait(10)
        self.ran.append(int(inputs["x"][0]))
        return {"y": inputs["x"]}


def test_waiting_requests_get_the_instance_in_order_of_arrival_and_cancelled_ones_never_run() -> None:
    instance = GatedInstance()
    scheduler = DirectScheduler("m", [instance])

    async def main() -> None:
        tasks = [
            asyncio.ensure_future(scheduler.execute(Job({"x": np.full(1, i)}, ["y"])))
            for i in range(4)
        ]
        await asyncio.sleep(0.05)
        assert scheduler.pending == 3  # request 0 runs, the others wait
        tasks[2].cancel()  # waiting: it never runs
        await asyncio.sleep(0)
        assert scheduler.pending == 2
        instance.gate.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        assert isinstance(done[2], asyncio.CancelledError)
        assert [
            int(cast("dict[str, np.ndarray]", d)["y"][0]) for i, d in enumerate(done) if i != 2
        ] == [0, 1, 3]
        assert instance.ran == [0, 1, 3]
        assert scheduler.pending == 0

    event_loop.run(main())
    scheduler.close()


def test_a_request_cancelled_just_as_it_is_handed_the_instance_passes_it_on() -> None:
    """Handed over (its waiter resolved) and cancelled before it resumed: the instance goes
    to the next waiting request, so none is lost."""
    instance = GatedInstance()
    instance.gate.set()
    scheduler = DirectScheduler("m", [instance])

    async def main() -> None:
        runner = scheduler._free.popleft()  # the instance is busy elsewhere
        first = asyncio.ensure_future(scheduler.execute(Job({"x": np.full(1, 1)}, ["y"])))
        second = asyncio.ensure_future(scheduler.execute(Job({"x": np.full(1, 2)}, ["y"])))
        await asyncio.sleep(0)
        scheduler._give_back(runner)  # resolves the first waiter...
        first.cancel()  # ...which is cancelled before it resumes
        result = await asyncio.wait_for(second, 5)
        assert int(result["y"][0]) == 2
        with pytest.raises(asyncio.CancelledError):
            await first
        assert instance.ran == [2]
        assert len(scheduler._free) == 1 and scheduler.pending == 0

    event_loop.run(main())
    scheduler.close()
