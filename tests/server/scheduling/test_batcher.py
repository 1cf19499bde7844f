"""DynamicBatcher policy tests with a fake backend and a fake clock, mirroring Triton's
``qa/L0_batcher/batcher_test.py`` and ``qa/L0_model_queue/model_queue_test.py`` cases
(triton-facts §4.1).

The fake model records every executed batch (instance, rows, which requests' rows in which
order, a copy of the inputs), doubles its input into ``y`` and echoes it into ``z`` (``z`` shares
memory with the input, as an identity model's output may). A request's rows carry its tag:
row ``r`` of request ``t`` holds ``t * 1000 + r * width + column``, so every request has distinct
values and a batch tells which requests it held. Executions can be held on a
``threading.Event`` per tag ("gate") so that work accumulates while an instance is busy; every
execution also sleeps a little so that the runner never judges the model fast enough to run it
inline on the event loop (``runner.INLINE_BELOW_S``).

The batcher's clock is a float the test advances. The batcher sleeps in real time for the
delay it computes from the clock, so after moving the clock the test wakes it
(``batcher._notify()``, what a new request or a finished batch does too).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import pytest

from backends.base import ModelInstance
from server import event_loop
from server.errors import InternalError, Unavailable
from server.generated import model_config_pb2 as mc
from server.memory.output_memory import OutputMemory
from server.observability.statistics import ModelStats
from server.scheduling.batcher import BatchingPolicy, DynamicBatcher, QueuePolicy, _yield_until
from server.scheduling.job import Job
from server.scheduling.layout import BatchInputSpec, BatchLayout, ScatterOutput
from server.scheduling.runner import INLINE_BELOW_S

WIDTH = 4
#: How long every fake execution takes: well above what the runner would run inline.
WORK_S = max(0.002, 20 * INLINE_BELOW_S)
#: Real time given to the loop and the instance threads before checking that nothing ran.
SETTLE_S = 0.05
#: The queue delay of the tests that wait for it: only the fake clock ever reaches it.
DELAY_US = 10_000_000


# --- the fake model -----------------------------------------------------------------------


@dataclass
class Batch:
    """One execution as the fake model saw it."""

    instance: int
    rows: int
    tags: list[int]  # the requests in the batch, in row order
    inputs: dict[str, np.ndarray]
    thread: str


@dataclass
class FakeModel:
    """What every instance of one fake model shares: the record of executions, the gates, and
    the faults to inject."""

    work_s: float = WORK_S
    #: rows the model leaves out of its outputs (a model fault the batcher must catch)
    row_shortfall: int = 0
    #: raise this from every execution
    error: Exception | None = None
    batches: list[Batch] = field(default_factory=list)
    gates: dict[int, threading.Event] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def instances(self, count: int) -> list[FakeInstance]:
        return [FakeInstance(self, index) for index in range(count)]

    def gate(self, tag: int) -> threading.Event:
        """Hold every execution holding request ``tag`` until the event is set."""
        event = threading.Event()
        self.gates[tag] = event
        return event

    def release_all(self) -> None:
        for event in self.gates.values():
            event.set()

    def executed(self) -> list[list[int]]:
        """The tags of every batch, in the order executions started."""
        with self.lock:
            return [list(batch.tags) for batch in self.batches]

    def batch_rows(self) -> list[int]:
        with self.lock:
            return [batch.rows for batch in self.batches]

    def executed_tags(self) -> list[int]:
        return [tag for tags in self.executed() for tag in tags]


class FakeInstance(ModelInstance):
    def __init__(self, model: FakeModel, index: int) -> None:
        self.model = model
        self.index = index

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        model = self.model
        x = inputs["x"]
        row_tags = [int(value) // 1000 for value in x[:, 0]]
        tags = [tag for i, tag in enumerate(row_tags) if i == 0 or row_tags[i - 1] != tag]
        with model.lock:
            model.batches.append(
                Batch(
                    self.index,
                    x.shape[0],
                    tags,
                    {name: np.array(value, copy=True) for name, value in inputs.items()},
                    threading.current_thread().name,
                )
            )
        for tag in tags:
            gate = model.gates.get(tag)
            if gate is not None:
                assert gate.wait(30), f"gate of request {tag} never opened"
        time.sleep(model.work_s)
        if model.error is not None:
            raise model.error
        rows = x.shape[0] - model.row_shortfall
        outputs = {"y": (x * 2)[:rows], "z": x[:rows]}  # z aliases the (gathered) input
        return {name: outputs[name] for name in output_names}


class FakeClock:
    """The batcher's clock: seconds that move only when the test says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


# --- helpers --------------------------------------------------------------------------------


def data(tag: int, rows: int = 1, width: int = WIDTH) -> np.ndarray:
    """Request ``tag``'s input: distinct values, every one of them tagged."""
    values = tag * 1000 + np.arange(rows * width, dtype=np.float32)
    return values.reshape(rows, width)


def job(
    tag: int,
    rows: int = 1,
    *,
    width: int = WIDTH,
    priority: int = 0,
    timeout_us: int | None = None,
    outputs: Sequence[str] = ("y",),
) -> Job:
    return Job(
        {"x": data(tag, rows, width)},
        list(outputs),
        rows=rows,
        priority=priority,
        timeout_us=timeout_us,
    )


@contextlib.asynccontextmanager
async def serving(
    model: FakeModel,
    policy: BatchingPolicy,
    *,
    instances: int = 1,
    clock: FakeClock | None = None,
    stats: ModelStats | None = None,
) -> AsyncIterator[DynamicBatcher]:
    """A batcher over ``instances`` fake instances; on the way out every gate opens, the
    work in flight finishes and the batcher closes."""
    batcher = DynamicBatcher(
        "fake-1",  # labelled as the loader labels them: <model>-<version>
        model.instances(instances),
        policy,
        stats,
        clock=clock or FakeClock(),
        model="fake",
    )
    try:
        yield batcher
    finally:
        model.release_all()
        batcher._notify()
        await asyncio.sleep(0.1)  # let running batches hand their answers back
        batcher.close()


async def submit(
    batcher: DynamicBatcher, *jobs: Job
) -> list[asyncio.Task[dict[str, np.ndarray]]]:
    """Start requests and return once all of them are queued (at the clock's present time),
    before the batcher's next look at the queue."""
    tasks = [asyncio.create_task(batcher.execute(j)) for j in jobs]
    await asyncio.sleep(0)  # each task runs up to its first wait: it is queued by then
    return tasks


async def settle(seconds: float = SETTLE_S) -> None:
    """Give the loop and the instance threads some real time."""
    await asyncio.sleep(seconds)


async def until(condition: Callable[[], bool], what: str = "", timeout: float = 5.0) -> None:
    """Wait (in real time) until ``condition()`` holds; fail saying ``what`` was expected."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        await asyncio.sleep(0.002)


async def advance(clock: FakeClock, batcher: DynamicBatcher, to: float) -> None:
    """Move the fake clock to ``to`` seconds, wake the batcher and let it act."""
    clock.now = to
    batcher._notify()
    await settle()


async def results(tasks: Sequence[asyncio.Task[dict[str, np.ndarray]]]) -> list[object]:
    return await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)


def assert_own_rows(answer: object, tag: int, rows: int, width: int = WIDTH) -> None:
    assert isinstance(answer, dict), answer
    np.testing.assert_array_equal(answer["y"], 2 * data(tag, rows, width))


def triton_policy(**overrides: object) -> BatchingPolicy:
    """Triton's L0_batcher setting: max_batch_size 8, preferred [2, 6], a long delay."""
    settings: dict[str, object] = {
        "max_batch_size": 8,
        "preferred_sizes": (2, 6),
        "max_queue_delay_us": DELAY_US,
    }
    settings.update(overrides)
    return BatchingPolicy(**settings)  # type: ignore[arg-type]


# --- batch formation: preferred sizes, delay, max size ----------------------------------------


def test_static_batch_preferred_is_sent_at_once() -> None:
    """test_static_batch_preferred: requests of a preferred size do not wait."""
    model, clock = FakeModel(), FakeClock()

    async def scenario() -> None:
        async with serving(model, triton_policy(), clock=clock) as batcher:
            two = await submit(batcher, job(1, 2))
            await until(lambda: model.batch_rows() == [2])
            six = await submit(batcher, job(2, 6))
            await until(lambda: model.batch_rows() == [2, 6])
            answers = await results(two + six)
            assert_own_rows(answers[0], 1, 2)
            assert_own_rows(answers[1], 2, 6)
            assert clock.now == 0.0

    event_loop.run(scenario())


@pytest.mark.parametrize("sizes", [(1,), (3,), (1, 3)], ids=["lt_any", "not_preferred", "multi"])
def test_batch_below_preferred_waits_until_the_oldest_delay_expires(
    sizes: tuple[int, ...],
) -> None:
    """test_static_batch_lt_any_preferred / _not_preferred, test_multi_batch_not_preferred:
    the pending batch goes when its oldest request has waited the delay, not before; a later
    request joins it without restarting the delay."""
    model, clock = FakeModel(), FakeClock()
    delay_s = DELAY_US / 1e6

    async def scenario() -> None:
        async with serving(model, triton_policy(), clock=clock) as batcher:
            tasks = await submit(batcher, job(1, sizes[0]))
            await settle()
            if len(sizes) > 1:
                await advance(clock, batcher, delay_s / 2)
                tasks += await submit(batcher, job(2, sizes[1]))
            await advance(clock, batcher, delay_s - 1e-3)
            assert model.executed() == []
            assert not any(task.done() for task in tasks)
            await advance(clock, batcher, delay_s)
            await until(lambda: len(model.executed()) == 1)
            assert model.batch_rows() == [sum(sizes)]
            answers = await results(tasks)
            for tag, (rows, answer) in enumerate(zip(sizes, answers, strict=True), start=1):
                assert_own_rows(answer, tag, rows)

    event_loop.run(scenario())


def test_static_batch_gt_max_preferred_is_sent_at_once() -> None:
    """test_static_batch_gt_max_preferred: a request larger than the largest preferred size
    (7 > 6, max_batch_size 8) cannot reach a preferred size and is issued immediately."""
    model, clock = FakeModel(), FakeClock()

    async def scenario() -> None:
        async with serving(model, triton_policy(), clock=clock) as batcher:
            tasks = await submit(batcher, job(1, 7))
            await until(
                lambda: model.batch_rows() == [7],
                "the 7-row request to run at once (the fake clock never reaches the delay)",
                timeout=2.0,
            )
            assert_own_rows((await results(tasks))[0], 1, 7)

    event_loop.run(scenario())


def test_multi_batch_gt_max_preferred() -> None:
    """test_multi_batch_gt_max_preferred: 3 rows wait; 7 rows arrive: 3 goes at once (7 does
    not fit with it) and 7, over the largest preferred size, goes at once too."""
    model, clock = FakeModel(), FakeClock()

    async def scenario() -> None:
        async with serving(model, triton_policy(), clock=clock) as batcher:
            tasks = await submit(batcher, job(1, 3))
            await settle()
            assert model.executed() == []
            tasks += await submit(batcher, job(2, 7))
            await until(
                lambda: model.executed() == [[1], [2]],
                "3 rows, then 7 rows at once (the fake clock never reaches the delay)",
                timeout=2.0,
            )
            answers = await results(tasks)
            assert_own_rows(answers[0], 1, 3)
            assert_own_rows(answers[1], 2, 7)

    event_loop.run(scenario())


def test_multi_batch_use_biggest_preferred() -> None:
    """test_multi_batch_use_biggest_preferred: six 1-row requests reach 2 and 6; 6 is sent."""
    model, clock = FakeModel(), FakeClock()

    async def scenario() -> None:
        async with serving(model, triton_policy(), clock=clock) as batcher:
            tasks = await submit(batcher, *(job(tag) for tag in range(1, 7)))
            await until(lambda: len(model.executed()) == 1)
            await settle()
            assert model.executed() == [[1, 2, 3, 4, 5, 6]]
            for tag, answer in enumerate(await results(tasks), start=1):
                assert_own_rows(answer, tag, 1)

    event_loop.run(scenario())


def test_largest_reachable_preferred_size_then_the_rest_after_the_delay() -> None:
    """Preferred [2, 4, 6]: requests of 1, 1, 2, 2, 1 rows reach 2, 4 and 6; the 6 goes at
    once, the last request waits for its delay."""
    model, clock = FakeModel(), FakeClock()
    policy = triton_policy(preferred_sizes=(2, 4, 6))

    async def scenario() -> None:
        async with serving(model, policy, clock=clock) as batcher:
            sizes = (1, 1, 2, 2, 1)
            tasks = await submit(batcher, *(job(tag, rows) for tag, rows in enumerate(sizes, 1)))
            await until(lambda: len(model.executed()) == 1)
            await settle()
            assert model.executed() == [[1, 2, 3, 4]]
            await advance(clock, batcher, DELAY_US / 1e6)
            await until(lambda: len(model.executed()) == 2)
            assert model.executed()[1] == [5]
            for tag, (rows, answer) in enumerate(zip(sizes, await results(tasks)), start=1):
                assert_own_rows(answer, tag, rows)

    event_loop.run(scenario())


def test_multi_batch_use_best_preferred() -> None:
    """test_multi_batch_use_best_preferred: three 1-row requests: 2 goes at once (preferred),
    the third after the delay."""
    model, clock = FakeModel(), FakeClock()

    async def scenario() -> None:
        async with serving(model, triton_policy(), clock=clock) as batcher:
            tasks = await submit(batcher, job(1), job(2), job(3))
            await until(lambda: len(model.executed()) == 1)
            await settle()
            assert model.executed() == [[1, 2]]
            assert not tasks[2].done()
            await advance(clock, batcher, DELAY_US / 1e6)
            await until(lambda: len(model.executed()) == 2)
            assert model.batch_rows() == [2, 1]
            await results(tasks)

    event_loop.run(scenario())


def test_multi_batch_delayed_sum_gt_max_preferred() -> None:
    """test_multi_batch_delayed_sum_gt_max_preferred: 3 and 4 rows queued together. 3 + 4
    exceeds the largest preferred size (6), so Triton sends the 3 at once and the 4, alone
    below every preferred size, after the delay (batches {3: 1, 4: 1})."""
    model, clock = FakeModel(), FakeClock()

    async def scenario() -> None:
        async with serving(model, triton_policy(), clock=clock) as batcher:
            tasks = await submit(batcher, job(1, 3), job(2, 4))
            await until(
                lambda: len(model.executed()) > 0,
                "the 3-row request to run at once (the fake clock never reaches the delay)",
                timeout=2.0,
            )
            await settle()
            assert model.batch_rows() == [3], "the 4-row request did not wait for its delay"
            await advance(clock, batcher, DELAY_US / 1e6)
            await until(lambda: len(model.executed()) == 2)
            assert model.batch_rows() == [3, 4]
            answers = await results(tasks)
            assert_own_rows(answers[0], 1, 3)
            assert_own_rows(answers[1], 2, 4)

    event_loop.run(scenario())


def test_multi_batch_delayed_use_max_batch() -> None:
    """test_multi_batch_delayed_use_max_batch: 3 and 4 rows wait past the delay while the
    only instance is busy; 1 more row arrives; when the instance frees up the three fill
    max_batch_size 8 together."""
    model, clock = FakeModel(), FakeClock()
    gate = model.gate(9)

    async def scenario() -> None:
        async with serving(model, triton_policy(), clock=clock) as batcher:
            busy = await submit(batcher, job(9, 6, width=5))  # preferred size: runs at once
            await until(lambda: len(model.executed()) == 1)
            tasks = await submit(batcher, job(1, 3), job(2, 4))
            await advance(clock, batcher, 1.1 * DELAY_US / 1e6)
            tasks += await submit(batcher, job(3, 1))
            await settle()
            assert len(model.executed()) == 1
            gate.set()
            await until(lambda: len(model.executed()) == 2)
            assert model.executed()[1] == [1, 2, 3]
            assert model.batch_rows() == [6, 8]
            for tag, rows, answer in zip((1, 2, 3), (3, 4, 1), await results(tasks)):
                assert_own_rows(answer, tag, rows)
            await results(busy)

    event_loop.run(scenario())


def test_delay_zero_sends_whatever_is_pending_at_once() -> None:
    """max_queue_delay 0 and no preferred size (test_max_queue_delay_only_default): nothing
    waits; requests queued while the instance is busy go together as soon as it is free."""
    model = FakeModel()
    gate = model.gate(1)
    policy = BatchingPolicy(max_batch_size=8)

    async def scenario() -> None:
        async with serving(model, policy) as batcher:
            tasks = await submit(batcher, job(1))
            await until(lambda: len(model.executed()) == 1)
            tasks += await submit(batcher, *(job(tag) for tag in range(2, 7)))
            await settle()
            assert len(model.executed()) == 1  # the only instance is busy
            gate.set()
            await until(lambda: len(model.executed()) == 2)
            assert model.executed() == [[1], [2, 3, 4, 5, 6]]
            for tag, answer in enumerate(await results(tasks), start=1):
                assert_own_rows(answer, tag, 1)

    event_loop.run(scenario())


@pytest.mark.parametrize(
    ("count", "expected"),
    [(4, [4]), (5, [4, 1]), (7, [6, 1]), (3, [3])],
    ids=["aligned", "unaligned", "use_biggest_preferred", "use_no_preferred_size"],
)
def test_preferred_batch_only(count: int, expected: list[int]) -> None:
    """test_preferred_batch_only_*: preferred [4, 6] with the default delay 0, requests of
    one row queued before the batcher looks: Triton still cuts the batch at the largest
    preferred size reached (its delay check is off when the delay is 0), then sends the rest
    at once."""
    model = FakeModel()
    policy = BatchingPolicy(max_batch_size=8, preferred_sizes=(4, 6))

    async def scenario() -> None:
        async with serving(model, policy) as batcher:
            tasks = await submit(batcher, *(job(tag) for tag in range(1, count + 1)))
            answers = await results(tasks)
            assert model.batch_rows() == expected
            for tag, answer in enumerate(answers, start=1):
                assert_own_rows(answer, tag, 1)

    event_loop.run(scenario())


def test_max_batch_size_overflow_starts_a_new_batch_and_never_splits() -> None:
    """max_batch_size 4, delay 0: 3 + 3 + 2 rows become batches of 3, 3 and 2; no request is
    split across batches."""
    model = FakeModel()
    policy = BatchingPolicy(max_batch_size=4)

    async def scenario() -> None:
        async with serving(model, policy) as batcher:
            sizes = (3, 3, 2)
            tasks = await submit(batcher, *(job(tag, rows) for tag, rows in enumerate(sizes, 1)))
            answers = await results(tasks)
            assert model.executed() == [[1], [2], [3]]
            assert model.batch_rows() == [3, 3, 2]
            for tag, (rows, answer) in enumerate(zip(sizes, answers), start=1):
                assert_own_rows(answer, tag, rows)

    event_loop.run(scenario())


def test_overflow_with_delay_sends_the_full_part_and_holds_the_rest() -> None:
    """max_batch_size 4, no preferred size, a delay: 3 + 3 rows: the first 3 cannot grow
    (the next request does not fit) and goes at once; the second waits for its delay."""
    model, clock = FakeModel(), FakeClock()
    policy = BatchingPolicy(max_batch_size=4, max_queue_delay_us=DELAY_US)

    async def scenario() -> None:
        async with serving(model, policy, clock=clock) as batcher:
            tasks = await submit(batcher, job(1, 3), job(2, 3))
            await until(lambda: len(model.executed()) == 1)
            await settle()
            assert model.executed() == [[1]]
            await advance(clock, batcher, DELAY_US / 1e6)
            await until(lambda: len(model.executed()) == 2)
            assert model.batch_rows() == [3, 3]
            await results(tasks)

    event_loop.run(scenario())


# --- shapes and outputs ------------------------------------------------------------------------


def test_multi_batch_different_shape() -> None:
    """test_multi_batch_different_shape: 1 + 1 rows would be preferred size 2, but the
    non-batch shapes differ: the first goes at once, the second after the delay."""
    model, clock = FakeModel(), FakeClock()

    async def scenario() -> None:
        async with serving(model, triton_policy(), clock=clock) as batcher:
            tasks = await submit(batcher, job(1, width=4), job(2, width=5))
            await until(lambda: len(model.executed()) == 1)
            await settle()
            assert model.executed() == [[1]]
            await advance(clock, batcher, DELAY_US / 1e6)
            await until(lambda: len(model.executed()) == 2)
            assert model.executed() == [[1], [2]]
            answers = await results(tasks)
            assert_own_rows(answers[0], 1, 1, width=4)
            assert_own_rows(answers[1], 2, 1, width=5)

    event_loop.run(scenario())


class RaggedInstance(ModelInstance):
    """A model whose ragged input ``x`` arrives flattened: ``y = 2 * x``, element by element,
    with the request boundaries in the ``ends`` batch input."""

    def __init__(self) -> None:
        self.calls: list[dict[str, np.ndarray]] = []

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        self.calls.append({name: np.array(value, copy=True) for name, value in inputs.items()})
        time.sleep(WORK_S)
        return {"y": inputs["x"] * 2}


def test_multi_batch_different_shape_allow_ragged() -> None:
    """test_multi_batch_different_shape_allow_ragged: with ``allow_ragged_batch`` requests of
    different lengths share a batch; the model sees one flat input and the accumulated element
    counts, and every request gets its own elements back in its own shape."""
    instance, clock = RaggedInstance(), FakeClock()
    layout = BatchLayout(
        ragged=frozenset({"x"}),
        batch_inputs=[
            BatchInputSpec(
                mc.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT, ("ends",), np.dtype(np.int32), "x"
            )
        ],
        scatter_outputs={"y": ScatterOutput("x", (-1,))},
    )

    async def scenario() -> None:
        batcher = DynamicBatcher(
            "ragged", [instance], triton_policy(preferred_sizes=()), clock=clock, layout=layout
        )
        try:
            jobs = [job(1, width=3), job(2, width=4), job(3, 1, width=5)]
            tasks = await submit(batcher, *jobs)
            await settle()
            assert instance.calls == [], "3 rows wait for the delay (preferred size 8)"
            await advance(clock, batcher, DELAY_US / 1e6)
            answers = await results(tasks)
            assert len(instance.calls) == 1, "the three lengths must share one batch"
            (call,) = instance.calls
            assert call["x"].shape == (12,)
            np.testing.assert_array_equal(call["ends"], [3, 7, 12])
            for index, answer in enumerate(answers):
                assert isinstance(answer, dict), answer
                np.testing.assert_array_equal(answer["y"], 2 * jobs[index].inputs["x"])
        finally:
            batcher.close()

    event_loop.run(scenario())


async def _queue_time_s(delay_us: int) -> float:
    """Real time one lone request waits in a batcher with ``delay_us`` (real clock)."""
    model = FakeModel(work_s=0.0)
    batcher = DynamicBatcher("timed", model.instances(1), BatchingPolicy(8, (), delay_us))
    try:
        request = job(1)
        await batcher.execute(request)
        return request.times.queue_ns / 1e9
    finally:
        batcher.close()


def test_sub_millisecond_delays_are_waited_in_full() -> None:
    """Loop timers are whole milliseconds (epoll); shorter delays are yielded away, and never
    cut short."""
    for delay_us in (200, 700):
        waited = event_loop.run(_queue_time_s(delay_us))
        assert waited >= delay_us / 1e6, (delay_us, waited)


def test_yield_until_returns_when_woken() -> None:
    async def scenario() -> float:
        wake = asyncio.Event()
        asyncio.get_running_loop().call_soon(wake.set)
        start = time.perf_counter()
        await _yield_until(wake, 30.0)
        return time.perf_counter() - start

    assert event_loop.run(scenario()) < 10.0


def test_multi_batch_not_preferred_different_shape() -> None:
    """test_multi_batch_not_preferred_different_shape: 1 + 3 rows, then 1 row of another
    shape: the 4 go at once (the batch cannot grow), the last after the delay."""
    model, clock = FakeModel(), FakeClock()

    async def scenario() -> None:
        async with serving(model, triton_policy(), clock=clock) as batcher:
            tasks = await submit(batcher, job(1, 1), job(2, 3), job(3, 1, width=6))
            await until(lambda: len(model.executed()) == 1)
            await settle()
            assert model.executed() == [[1, 2]]
            await advance(clock, batcher, DELAY_US / 1e6)
            await until(lambda: len(model.executed()) == 2)
            assert model.batch_rows() == [4, 1]
            answers = await results(tasks)
            assert_own_rows(answers[2], 3, 1, width=6)

    event_loop.run(scenario())


def test_multi_batch_preferred_different_shape() -> None:
    """test_multi_batch_preferred_different_shape: 1 + 3 rows, then 1 + 5 rows of another
    shape: batches of 4 and of 6 (preferred), both at once."""
    model, clock = FakeModel(), FakeClock()

    async def scenario() -> None:
        async with serving(model, triton_policy(), clock=clock) as batcher:
            tasks = await submit(
                batcher, job(1, 1), job(2, 3), job(3, 1, width=6), job(4, 5, width=6)
            )
            await until(lambda: len(model.executed()) == 2)
            assert model.executed() == [[1, 2], [3, 4]]
            assert model.batch_rows() == [4, 6]
            answers = await results(tasks)
            assert_own_rows(answers[3], 4, 5, width=6)
            assert clock.now == 0.0

    event_loop.run(scenario())


@pytest.mark.parametrize(
    "outputs",
    [(("y",), ("y",)), (("z",), ("z",)), (("y",), ("z",)), (("y", "z"), ("z", "y"))],
    ids=["same_output0", "same_output1", "different_outputs", "different_output_order"],
)
def test_requests_asking_for_different_outputs_batch_together(
    outputs: tuple[tuple[str, ...], tuple[str, ...]],
) -> None:
    """test_multi_same_output0/1, test_multi_different_outputs/_output_order: one batch,
    each request gets exactly the outputs it asked for."""
    model = FakeModel()

    async def scenario() -> None:
        async with serving(model, triton_policy(max_queue_delay_us=0)) as batcher:
            tasks = await submit(batcher, job(1, outputs=outputs[0]), job(2, outputs=outputs[1]))
            answers = await results(tasks)
            assert model.batch_rows() == [2]
            for tag, wanted, answer in zip((1, 2), outputs, answers):
                assert isinstance(answer, dict), answer
                assert set(answer) == set(wanted)
                expected = {"y": 2 * data(tag), "z": data(tag)}
                for name in wanted:
                    np.testing.assert_array_equal(answer[name], expected[name])

    event_loop.run(scenario())


def test_every_request_gets_exactly_its_own_rows() -> None:
    """Many requests of mixed row counts with distinct values, batched over and over on two
    instances (reusing the gathered buffers): every answer holds the request's own rows,
    also the echoed output that aliased the gathered input buffer."""
    model = FakeModel(work_s=0.003)
    rng = np.random.default_rng(5)
    sizes = [int(rng.integers(1, 5)) for _ in range(60)]

    async def scenario() -> None:
        policy = BatchingPolicy(max_batch_size=8, max_queue_delay_us=0)
        async with serving(model, policy, instances=2) as batcher:
            tasks = []
            for tag, rows in enumerate(sizes, start=1):
                tasks += await submit(batcher, job(tag, rows, outputs=("y", "z")))
                if tag % 7 == 0:
                    await asyncio.sleep(0.002)
            answers = await results(tasks)
            assert any(len(tags) > 1 for tags in model.executed())
            assert sorted(model.executed_tags()) == list(range(1, len(sizes) + 1))
            for tag, (rows, answer) in enumerate(zip(sizes, answers), start=1):
                assert_own_rows(answer, tag, rows)
                assert isinstance(answer, dict)
                np.testing.assert_array_equal(answer["z"], data(tag, rows))
            assert all(rows <= 8 for rows in model.batch_rows())

    event_loop.run(scenario())


# --- priorities --------------------------------------------------------------------------------


def test_priority_levels_higher_level_first_and_default_level() -> None:
    """test_priority_levels: level 1 before level 2; priority 0 takes the default level (2);
    arrival order within a level."""
    model = FakeModel()
    gate = model.gate(1)
    policy = BatchingPolicy(max_batch_size=1, priority_levels=2, default_priority=2)

    async def scenario() -> None:
        async with serving(model, policy) as batcher:
            tasks = await submit(batcher, job(1, priority=1))
            await until(lambda: len(model.executed()) == 1)
            tasks += await submit(
                batcher,
                job(2, priority=2),
                job(3, priority=0),
                job(4, priority=1),
                job(5, priority=2),
                job(6, priority=1),
            )
            await settle()
            gate.set()
            answers = await results(tasks)
            assert model.executed_tags() == [1, 4, 6, 2, 3, 5]
            for tag, answer in enumerate(answers, start=1):
                assert_own_rows(answer, tag, 1)

    event_loop.run(scenario())


def test_priority_0_takes_the_default_level_1() -> None:
    """default_priority_level 1 of 3: priority 0 goes before levels 2 and 3."""
    model = FakeModel()
    gate = model.gate(1)
    policy = BatchingPolicy(max_batch_size=1, priority_levels=3, default_priority=1)

    async def scenario() -> None:
        async with serving(model, policy) as batcher:
            tasks = await submit(batcher, job(1))
            await until(lambda: len(model.executed()) == 1)
            tasks += await submit(batcher, job(2, priority=3), job(3, priority=2), job(4))
            await settle()
            gate.set()
            await results(tasks)
            assert model.executed_tags() == [1, 4, 3, 2]

    event_loop.run(scenario())


def test_priority_beyond_the_levels_means_the_default_level() -> None:
    """As Triton's InferenceRequest::SetPriority: a priority beyond ``priority_levels`` is
    served at the default level, not refused."""
    model = FakeModel()
    policy = BatchingPolicy(max_batch_size=4, priority_levels=2, default_priority=1)

    async def scenario() -> None:
        async with serving(model, policy) as batcher:
            assert_own_rows(await batcher.execute(job(1, priority=3)), 1, 1)
            assert_own_rows(await batcher.execute(job(2, priority=2)), 2, 1)
            assert model.executed_tags() == [1, 2]

    event_loop.run(scenario())


# --- queue policy ------------------------------------------------------------------------------


def test_queue_full_is_refused_with_exceeds_maximum_queue_size() -> None:
    """test_max_queue_size: with max_queue_size 2 the third queued request is refused with
    UNAVAILABLE "Exceeds maximum queue size"; once the queue drains requests are taken again.
    The limit is per priority level."""
    model, clock = FakeModel(), FakeClock()
    policy = BatchingPolicy(
        max_batch_size=8,
        preferred_sizes=(8,),
        max_queue_delay_us=DELAY_US,
        priority_levels=2,
        default_priority=1,
        policies={1: QueuePolicy(max_queue_size=2), 2: QueuePolicy()},
    )

    async def scenario() -> None:
        async with serving(model, policy, clock=clock) as batcher:
            tasks = await submit(batcher, job(1), job(2))
            await settle()
            assert batcher.pending == 2
            with pytest.raises(Unavailable) as refused:
                await batcher.execute(job(3))
            assert str(refused.value) == (
                "inference request for model 'fake' was rejected: Exceeds maximum queue size"
            )
            tasks += await submit(batcher, job(4, priority=2))  # level 2 is unbounded
            await settle()
            assert batcher.pending == 3
            await advance(clock, batcher, DELAY_US / 1e6)
            answers = await results(tasks)
            assert 3 not in model.executed_tags()
            assert_own_rows(answers[2], 4, 1)
            assert_own_rows(await batcher.execute(job(5, 8)), 5, 8)  # room again

    event_loop.run(scenario())


def test_timeout_reject_fails_the_queued_request_when_it_expires() -> None:
    """test_policy_reject: default_timeout 1 s, REJECT: a request still queued when its
    timeout expires fails with UNAVAILABLE "Request timeout expired" and never runs; a later
    one is unaffected; a request already running is not timed out."""
    model, clock = FakeModel(), FakeClock()
    gate = model.gate(1)
    policy = BatchingPolicy(
        max_batch_size=1, policies={1: QueuePolicy(timeout_us=1_000_000)}
    )

    async def scenario() -> None:
        async with serving(model, policy, clock=clock) as batcher:
            running = await submit(batcher, job(1))
            await until(lambda: len(model.executed()) == 1)
            early = await submit(batcher, job(2))
            await advance(clock, batcher, 0.5)
            late = await submit(batcher, job(3))
            await advance(clock, batcher, 0.999)
            assert not early[0].done()
            await advance(clock, batcher, 1.0)
            await until(early[0].done)
            with pytest.raises(Unavailable, match="Request timeout expired"):
                early[0].result()
            assert batcher.pending == 1
            assert not late[0].done()
            await advance(clock, batcher, 1.2)  # the running request is past 1 s too
            gate.set()
            answers = await results(running + late)
            assert_own_rows(answers[0], 1, 1)
            assert_own_rows(answers[1], 3, 1)
            assert model.executed_tags() == [1, 3]

    event_loop.run(scenario())


def test_timeout_delay_moves_the_request_behind_fresh_ones() -> None:
    """test_policy_delay: timeout_action DELAY: the expired request is not failed; it runs
    after the requests that arrived later and have not timed out."""
    model, clock = FakeModel(), FakeClock()
    gate = model.gate(1)
    policy = BatchingPolicy(
        max_batch_size=1,
        policies={1: QueuePolicy(timeout_us=1_000_000, delay_on_timeout=True)},
    )

    async def scenario() -> None:
        async with serving(model, policy, clock=clock) as batcher:
            tasks = await submit(batcher, job(1))
            await until(lambda: len(model.executed()) == 1)
            tasks += await submit(batcher, job(2))
            await advance(clock, batcher, 1.5)
            assert not tasks[1].done()
            assert batcher.pending == 1
            tasks += await submit(batcher, job(3), job(4))
            await settle()
            gate.set()
            answers = await results(tasks)
            assert model.executed_tags() == [1, 3, 4, 2]
            for tag, answer in enumerate(answers, start=1):
                assert_own_rows(answer, tag, 1)

    event_loop.run(scenario())


def test_timeout_override_only_shortens_the_policy_timeout() -> None:
    """test_timeout_override: with allow_timeout_override (level 1) a request's timeout
    applies only when shorter than the policy's; without it (level 2) it is ignored; with no
    policy timeout (level 3) it applies."""
    model, clock = FakeModel(), FakeClock()
    gate = model.gate(1)
    policy = BatchingPolicy(
        max_batch_size=1,
        priority_levels=3,
        default_priority=1,
        policies={
            1: QueuePolicy(timeout_us=1_000_000, allow_timeout_override=True),
            2: QueuePolicy(timeout_us=1_000_000),
            3: QueuePolicy(allow_timeout_override=True),
        },
    )

    async def scenario() -> None:
        async with serving(model, policy, clock=clock) as batcher:
            running = await submit(batcher, job(1, priority=3))
            await until(lambda: len(model.executed()) == 1)
            shorter, longer, none = await submit(
                batcher,
                job(2, priority=1, timeout_us=500_000),
                job(3, priority=1, timeout_us=2_000_000),
                job(4, priority=1),
            )
            (ignored,) = await submit(batcher, job(5, priority=2, timeout_us=500_000))
            (own,) = await submit(batcher, job(6, priority=3, timeout_us=700_000))
            await settle()
            await advance(clock, batcher, 0.5)
            await until(shorter.done, "the request's shorter timeout (0.5 s)")
            assert not (ignored.done() or longer.done() or none.done() or own.done())
            await advance(clock, batcher, 0.7)
            await until(own.done, "the request's own timeout (no policy timeout)")
            assert not (ignored.done() or longer.done() or none.done())
            await advance(clock, batcher, 1.0)
            await until(
                lambda: longer.done() and none.done() and ignored.done(),
                "the policy timeout (1 s)",
            )
            for task in (shorter, longer, none, ignored, own):
                with pytest.raises(Unavailable, match="Request timeout expired"):
                    task.result()
            gate.set()
            await results(running)
            assert model.executed_tags() == [1]

    event_loop.run(scenario())


# --- ordering, cancellation, instances ---------------------------------------------------------


def test_preserve_ordering_releases_answers_in_arrival_order() -> None:
    """test_multi_batch_preserve_ordering: the second request's batch finishes first on the
    other instance, but its answer is released only after the first request's."""
    model = FakeModel()
    gate = model.gate(1)
    policy = BatchingPolicy(max_batch_size=1, preserve_ordering=True)
    finished: list[int] = []

    async def scenario() -> None:
        async with serving(model, policy, instances=2) as batcher:
            tasks = await submit(batcher, job(1), job(2), job(3))
            for tag, task in enumerate(tasks, start=1):
                task.add_done_callback(
                    cast(Callable[[object], None], lambda _, tag=tag: finished.append(tag))
                )
            await until(lambda: len(model.executed()) == 3)  # 2 and 3 ran on the free one
            await settle()
            assert {batch.instance for batch in model.batches[:2]} == {0, 1}
            assert finished == [], "a later answer was released before the first"
            gate.set()
            answers = await results(tasks)
            assert finished == [1, 2, 3]
            for tag, answer in enumerate(answers, start=1):
                assert_own_rows(answer, tag, 1)

    event_loop.run(scenario())


def test_cancelled_queued_request_leaves_the_queue_and_never_runs() -> None:
    model = FakeModel()
    gate = model.gate(1)
    policy = BatchingPolicy(max_batch_size=1, policies={1: QueuePolicy(max_queue_size=1)})

    async def scenario() -> None:
        async with serving(model, policy) as batcher:
            running = await submit(batcher, job(1))
            await until(lambda: len(model.executed()) == 1)
            (queued,) = await submit(batcher, job(2))
            await settle()
            assert batcher.pending == 1
            queued.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            assert batcher.pending == 0
            (after,) = await submit(batcher, job(3))  # its place in the full queue is free
            await settle()
            gate.set()
            answers = await results([*running, after])
            assert_own_rows(answers[1], 3, 1)
            assert model.executed_tags() == [1, 3]

    event_loop.run(scenario())


def test_request_cancelled_after_dispatch_waits_for_its_batch() -> None:
    """Cancelled once its batch runs, the caller returns only when the batch is done with
    the request's inputs; the other requests of the batch get their answers."""
    model = FakeModel()
    gate = model.gate(1)
    policy = BatchingPolicy(max_batch_size=4)

    async def scenario() -> None:
        async with serving(model, policy) as batcher:
            tasks = await submit(batcher, job(1), job(2))
            await until(lambda: len(model.executed()) == 1)
            assert model.executed() == [[1, 2]]
            tasks[0].cancel()
            await settle()
            assert not tasks[0].done(), "returned while the instance still read its inputs"
            gate.set()
            answers = await results(tasks)
            assert isinstance(answers[0], asyncio.CancelledError)
            assert_own_rows(answers[1], 2, 1)
            assert model.executed() == [[1, 2]]

    event_loop.run(scenario())


def test_several_instances_pull_from_one_queue() -> None:
    """While one instance is held, the next request runs on the other one at once."""
    model = FakeModel()
    gates = [model.gate(1), model.gate(2)]
    policy = BatchingPolicy(max_batch_size=8)

    async def scenario() -> None:
        async with serving(model, policy, instances=2) as batcher:
            tasks = await submit(batcher, job(1))
            await until(lambda: len(model.executed()) == 1)
            tasks += await submit(batcher, job(2))
            await until(lambda: len(model.executed()) == 2)
            instances = {batch.instance for batch in model.batches}
            threads = {batch.thread for batch in model.batches}
            assert instances == {0, 1} and len(threads) == 2
            tasks += await submit(batcher, job(3), job(4))  # both busy: these wait together
            await settle()
            assert len(model.executed()) == 2
            for gate in gates:
                gate.set()
            answers = await results(tasks)
            assert model.executed()[2] == [3, 4]
            for tag, answer in enumerate(answers, start=1):
                assert_own_rows(answer, tag, 1)

    event_loop.run(scenario())


# --- model faults and statistics ---------------------------------------------------------------


def test_wrong_row_count_fails_every_request_of_the_batch() -> None:
    """The model answers a batch of 2 + 1 rows with 2 rows: every request of the batch gets
    an InternalError, none an empty or shifted answer."""
    model = FakeModel(row_shortfall=1)
    policy = BatchingPolicy(max_batch_size=8)

    async def scenario() -> None:
        async with serving(model, policy) as batcher:
            answers = await results(await submit(batcher, job(1, 2), job(2, 1)))
            assert model.executed() == [[1, 2]]
            for answer in answers:
                assert isinstance(answer, InternalError), answer
                assert str(answer) == (
                    "model 'fake' returned output 'y' with 2 rows for a batch of 3"
                )

    event_loop.run(scenario())


def test_model_error_fails_every_request_of_the_batch_and_the_batcher_goes_on() -> None:
    model = FakeModel(error=RuntimeError("model exploded"))
    policy = BatchingPolicy(max_batch_size=8)

    async def scenario() -> None:
        async with serving(model, policy) as batcher:
            answers = await results(await submit(batcher, job(1), job(2, 3)))
            assert model.executed() == [[1, 2]]
            assert all("model exploded" in str(answer) for answer in answers)
            model.error = None
            assert_own_rows(await batcher.execute(job(3, 2)), 3, 2)

    event_loop.run(scenario())


def test_statistics_count_executions_by_batch_size() -> None:
    model = FakeModel()
    stats = ModelStats()
    gate = model.gate(1)
    policy = BatchingPolicy(max_batch_size=8)

    async def scenario() -> None:
        async with serving(model, policy, stats=stats) as batcher:
            tasks = await submit(batcher, job(1))
            await until(lambda: len(model.executed()) == 1)
            tasks += await submit(batcher, job(2, 2), job(3, 3))
            await settle()
            gate.set()
            await results(tasks)
            await results(await submit(batcher, job(4, 2), job(5, 3)))

    event_loop.run(scenario())
    assert model.batch_rows() == [1, 5, 5]
    assert stats.execution_count == 3
    assert {size: s.compute_infer.count for size, s in stats.batch_stats.items()} == {1: 1, 5: 2}


class _FirstInputEcho(ModelInstance):
    """Slow enough to stay on its thread; answers with its first input, doubled."""

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        time.sleep(0.02)
        first = inputs[min(inputs)]
        return {name: first * 2 for name in output_names}


def test_requests_with_different_optional_inputs_are_not_merged() -> None:
    """Triton: optional inputs force the same input set; same shapes are not enough."""
    batcher = DynamicBatcher("m", [_FirstInputEcho()], BatchingPolicy(max_batch_size=8))

    async def scenario() -> Sequence[dict[str, np.ndarray]]:
        busy = asyncio.ensure_future(
            batcher.execute(Job({"A": np.ones((1, 4), np.float32)}, ["OUT"]))
        )
        await asyncio.sleep(0.005)  # the instance is busy: the next two queue together
        return await asyncio.gather(
            busy,
            batcher.execute(Job({"A": np.full((1, 4), 3, np.float32)}, ["OUT"])),
            batcher.execute(Job({"B": np.full((1, 4), 5, np.float32)}, ["OUT"])),
        )

    results = event_loop.run(scenario())
    assert [float(r["OUT"][0, 0]) for r in results] == [2.0, 6.0, 10.0]
    batcher.close()


def test_large_batches_are_gathered_on_the_instance_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Gathering copies as many bytes as the batch holds: for batches above the small-request
    size it happens on the instance's thread, with the execution; answers are unchanged."""
    gathered_on: list[str] = []
    original = BatchLayout.gather

    def recording(self: BatchLayout, jobs: Any, buffers: Any) -> Any:
        gathered_on.append(threading.current_thread().name)
        return original(self, jobs, buffers)

    monkeypatch.setattr(BatchLayout, "gather", recording)
    model = FakeModel()
    width = 10_000  # 40 KB a row: two rows pass the 64 KiB small-request size

    async def scenario() -> None:
        async with serving(model, BatchingPolicy(max_batch_size=8)) as batcher:
            small = await submit(batcher, job(1, 1))
            await results(small)
            big = await submit(batcher, job(2, 1, width=width), job(3, 1, width=width))
            answers = await results(big)
            assert_own_rows(answers[0], 2, 1, width=width)
            assert_own_rows(answers[1], 3, 1, width=width)

    event_loop.run(scenario())
    main = threading.current_thread().name
    assert gathered_on[0] == main, "a small batch is gathered on the loop"
    assert gathered_on[-1].startswith("fake-"), gathered_on
    assert model.batch_rows()[-1] == 2


class JoiningInstance(FakeInstance):
    """A GPU-like instance: given each request's rows as separate parts, which it joins."""

    joins_on_device = True

    def __init__(self, model: FakeModel, index: int) -> None:
        super().__init__(model, index)
        self.parts: list[list[int]] = []  # rows of each part, per execution
        self.offered: list[OutputMemory | None] = []  # the memory offered, per execution

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        raise AssertionError("a joining instance is given parts, never joined inputs")

    def execute_parts(
        self,
        parts: Mapping[str, Sequence[Any]],
        output_names: Sequence[str],
        memory: OutputMemory | None = None,
    ) -> dict[str, np.ndarray]:
        self.parts.append([part.shape[0] for part in parts["x"]])
        self.offered.append(memory)
        joined = {name: np.concatenate(pieces) for name, pieces in parts.items()}
        return super().execute(joined, output_names)


def test_instances_that_join_on_the_device_get_every_request_as_its_own_part() -> None:
    """No host concatenation for GPU instances: each request's rows reach the instance as a
    part of their own (its pinned request buffer), on the instance's thread."""
    model = FakeModel()
    instance = JoiningInstance(model, 0)

    async def scenario() -> None:
        batcher = DynamicBatcher("fake-1", [instance], BatchingPolicy(max_batch_size=8))
        try:
            gate = model.gate(1)
            first = await submit(batcher, job(1, 1))
            await until(lambda: len(model.batches) == 1, "the first batch to start")
            rest = await submit(batcher, job(2, 2), job(3, 1))
            gate.set()
            answers = await results([*first, *rest])
            for answer, (tag, rows) in zip(answers, [(1, 1), (2, 2), (3, 1)]):
                assert_own_rows(answer, tag, rows)
        finally:
            model.release_all()
            batcher.close()

    event_loop.run(scenario())
    assert instance.parts == [[1], [2, 1]]
    assert all(batch.thread.startswith("fake-") for batch in model.batches)


class Offered:
    """The ``OutputMemory`` of one request (never asked for here: what is offered counts)."""

    def allocate(self, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray | None:
        return None


def test_a_request_batched_alone_offers_its_memory_to_an_instance_that_joins_on_the_device(
) -> None:
    """A GPU instance may then copy its outputs back straight into the request's block of the
    result arena; a batch of several requests offers none (their rows share each output)."""
    model = FakeModel()
    instance = JoiningInstance(model, 0)
    alone, first, second = (job(tag) for tag in (1, 2, 3))
    alone.memory, first.memory, second.memory = Offered(), Offered(), Offered()

    async def scenario() -> None:
        batcher = DynamicBatcher("fake-1", [instance], BatchingPolicy(max_batch_size=8))
        try:
            await results(await submit(batcher, alone))
            gate = model.gate(4)
            blocker = await submit(batcher, job(4))
            await until(lambda: len(model.batches) == 2, "the blocking batch to start")
            pair = await submit(batcher, first, second)
            gate.set()
            await results([*blocker, *pair])
        finally:
            model.release_all()
            batcher.close()

    event_loop.run(scenario())
    assert instance.parts == [[1], [1], [1, 1]]
    assert instance.offered == [alone.memory, None, None]
