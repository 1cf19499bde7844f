"""InstanceRunner: executions move inline once they prove cheap, and back when they slow."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Mapping, Sequence

import numpy as np

from backends.base import ModelInstance
from server import event_loop
from server.memory.output_memory import OutputMemory
from server.scheduling.runner import (
    INLINE_BELOW_S,
    INLINE_WINDOW,
    SMALL_REQUEST_BYTES,
    InstanceRunner,
)


class RecordingInstance(ModelInstance):
    """Echoes its input; records the thread of each call and sleeps ``delay_s``."""

    def __init__(self) -> None:
        self.threads: list[str] = []
        self.delay_s = 0.0
        self.closed = False

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        self.threads.append(threading.current_thread().name)
        if self.delay_s:
            time.sleep(self.delay_s)
        return {name: inputs["x"] for name in output_names}

    def close(self) -> None:
        self.closed = True


def test_fast_model_moves_inline_then_back_to_its_thread_when_slow() -> None:
    instance = RecordingInstance()
    runner = InstanceRunner("m-0", instance)
    main = threading.current_thread().name

    async def run_many(count: int, until_inline: bool = False) -> None:
        for _ in range(count):
            out = await runner.run({"x": np.arange(3)}, ["y"])
            np.testing.assert_array_equal(out["y"], np.arange(3))
            if until_inline and instance.threads[-1] == main:
                return

    # A busy machine can make every early timing on the thread slow: run until the move,
    # within a bound.
    event_loop.run(run_many(500, until_inline=True))
    assert instance.threads[0].startswith("m-0")  # timed on the worker first
    assert instance.threads[-1] == main  # then inline
    assert runner.small_runs_inline

    instance.delay_s = 20 * INLINE_BELOW_S
    event_loop.run(run_many(1))  # one slow run (a preemption, say) is not a slowdown
    assert runner.small_runs_inline
    event_loop.run(run_many(INLINE_WINDOW // 2))  # most of the recent ones slow: it is
    assert not runner.small_runs_inline
    event_loop.run(run_many(1))
    assert instance.threads[-1].startswith("m-0")
    runner.close()
    assert instance.closed


def test_slow_model_stays_on_its_thread() -> None:
    instance = RecordingInstance()
    instance.delay_s = 3 * INLINE_BELOW_S
    runner = InstanceRunner("slow-0", instance)

    async def run_many() -> None:
        for _ in range(12):
            await runner.run({"x": np.arange(2)}, ["y"])

    event_loop.run(run_many())
    assert all(name.startswith("slow-0") for name in instance.threads)
    runner.close()


def test_model_errors_reach_the_caller() -> None:
    class Failing(RecordingInstance):
        def execute(
            self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
        ) -> dict[str, np.ndarray]:
            raise RuntimeError("model exploded")

    runner = InstanceRunner("f-0", Failing())

    async def run_once() -> None:
        await runner.run({"x": np.arange(1)}, ["y"])

    for _ in range(10):  # on the thread and, once timed as fast, inline
        try:
            event_loop.run(run_once())
        except RuntimeError as exc:
            assert "model exploded" in str(exc)
        else:
            raise AssertionError("the model's error was swallowed")
    runner.close()


def test_large_requests_always_run_on_the_thread() -> None:
    instance = RecordingInstance()
    runner = InstanceRunner("big-0", instance)
    main = threading.current_thread().name

    async def run(size: int) -> None:
        await runner.run({"x": np.zeros(size, dtype=np.uint8)}, ["y"])

    async def scenario() -> None:
        for _ in range(12):
            await run(16)
        await run(SMALL_REQUEST_BYTES + 1)

    event_loop.run(scenario())
    assert instance.threads[-2] == main  # small ones went inline...
    assert instance.threads[-1].startswith("big-0")  # ...the large one did not
    runner.close()


def test_cancelled_caller_waits_for_the_running_execution() -> None:
    instance = RecordingInstance()
    instance.delay_s = 0.2
    runner = InstanceRunner("c-0", instance)
    finished: list[float] = []

    async def scenario() -> None:
        task = asyncio.create_task(runner.run({"x": np.arange(2)}, ["y"]))
        await asyncio.sleep(0.05)
        started = time.perf_counter()
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            finished.append(time.perf_counter() - started)

    event_loop.run(scenario())
    # The cancellation came through only once the worker was done with the inputs.
    assert finished and finished[0] >= 0.1
    runner.close()


class SlowToClose(RecordingInstance):
    """Releasing takes a while (a Python model's finalize, say); records where it ran."""

    def close(self) -> None:
        time.sleep(0.3)
        self.threads.append(threading.current_thread().name)
        self.closed = True


def test_aclose_releases_on_the_worker_thread_while_the_loop_serves() -> None:
    instance = SlowToClose()
    runner = InstanceRunner("m-0", instance)

    async def scenario() -> int:
        ticks = 0

        async def tick() -> None:
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        ticker = asyncio.create_task(tick())
        await runner.aclose()
        ticker.cancel()
        return ticks

    ticks = event_loop.run(scenario())
    assert instance.closed
    assert instance.threads[-1].startswith("m-0"), "released on its own thread"
    assert ticks >= 10, f"the loop was stalled during the release ({ticks} ticks in 0.3 s)"


class Memory:
    def allocate(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:
        return np.empty(shape, dtype)


class OfferedInstance(RecordingInstance):
    """Records whether each run was offered memory for its outputs."""

    def __init__(self) -> None:
        super().__init__()
        self.offered: list[bool] = []

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        self.offered.append(False)
        return super().execute(inputs, output_names)

    def execute_into(
        self,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        memory: OutputMemory,
    ) -> dict[str, np.ndarray]:
        self.offered.append(True)
        return super().execute(inputs, output_names)


def test_only_large_requests_are_offered_memory_for_their_outputs() -> None:
    instance = OfferedInstance()
    runner = InstanceRunner("offer-0", instance)
    small = {"x": np.zeros(16, dtype=np.uint8)}
    large = {"x": np.zeros(SMALL_REQUEST_BYTES + 1, dtype=np.uint8)}

    async def scenario() -> None:
        for _ in range(10):  # on the thread, then inline: never offered
            await runner.run(small, ["y"], Memory())
        await runner.run(large, ["y"], Memory())
        await runner.run(large, ["y"])
        await runner.run_batch(lambda: small, ["y"], lambda outputs: outputs, Memory())

    event_loop.run(scenario())
    assert instance.offered == [False] * 10 + [True, False, True]
    runner.close()


def test_an_instance_that_joins_on_the_device_is_offered_memory_for_small_requests_too() -> None:
    """A GPU copies its outputs back from the device whatever the request's size: a small
    request with a large output (a generator's) gets them into the memory offered too."""
    instance = OfferedInstance()
    instance.joins_on_device = True
    instance.may_run_inline = False
    runner = InstanceRunner("offer-gpu-0", instance)

    async def scenario() -> None:
        for _ in range(10):
            await runner.run({"x": np.zeros(16, dtype=np.uint8)}, ["y"], Memory())

    event_loop.run(scenario())
    assert instance.offered == [True] * 10
    runner.close()
