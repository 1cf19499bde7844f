"""eager.start: a coroutine that never waits runs to its end at once, without a task; one that
waits goes on in a task, with results, cancellation and context as a task's."""

from __future__ import annotations

import asyncio
import contextvars
import sys

import pytest

from server import eager, event_loop

VAR: contextvars.ContextVar[str] = contextvars.ContextVar("VAR", default="unset")


def test_a_coroutine_that_never_waits_finishes_in_the_call_and_leaves_no_task() -> None:
    seen: list[str] = []

    async def work() -> None:
        VAR.set("inside")
        seen.append(VAR.get())

    async def main() -> None:
        before = len(asyncio.all_tasks())
        assert eager.start(work(), asyncio.get_running_loop()) is None
        assert seen == ["inside"]
        assert VAR.get() == "unset"  # its context was a copy
        assert len(asyncio.all_tasks()) == before

    event_loop.run(main())


def test_a_coroutine_that_waits_goes_on_in_a_task_with_its_results_and_context() -> None:
    steps: list[object] = []

    async def work(future: asyncio.Future[int]) -> None:
        VAR.set("mine")
        steps.append("started")
        steps.append(await future)
        await asyncio.sleep(0)
        steps.append(VAR.get())

    async def main() -> None:
        future = asyncio.get_running_loop().create_future()
        task = eager.start(work(future), asyncio.get_running_loop())
        assert task is not None
        assert steps == ["started"]  # the first step ran in the call
        future.set_result(7)
        await task
        assert steps == ["started", 7, "mine"]
        assert VAR.get() == "unset"

    event_loop.run(main())


def test_an_error_of_the_first_step_is_raised_by_start_and_a_later_one_by_the_task() -> None:
    async def fails_at_once() -> None:
        raise ValueError("first")

    async def fails_later() -> None:
        await asyncio.sleep(0)
        raise ValueError("later")

    async def main() -> None:
        with pytest.raises(ValueError, match="first"):
            eager.start(fails_at_once(), asyncio.get_running_loop())
        task = eager.start(fails_later(), asyncio.get_running_loop())
        assert task is not None
        with pytest.raises(ValueError, match="later"):
            await task

    event_loop.run(main())


@pytest.mark.parametrize("taken_over", [True, False])
def test_cancelling_the_task_cancels_what_the_coroutine_waits_on(taken_over: bool) -> None:
    """Whether the task had taken over or not yet (cancelled before its first step), the
    coroutine sees its future cancelled, and its cleanup runs."""
    outcome: list[str] = []

    async def work(future: asyncio.Future[None]) -> None:
        try:
            await future
        except asyncio.CancelledError:
            outcome.append("cancelled" if future.cancelled() else "future still pending")
            raise
        finally:
            outcome.append("finally")

    async def main() -> None:
        future = asyncio.get_running_loop().create_future()
        task = eager.start(work(future), asyncio.get_running_loop())
        assert task is not None
        if taken_over:
            await asyncio.sleep(0)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert future.cancelled()
        assert outcome == ["cancelled", "finally"]

    event_loop.run(main())


def test_a_first_step_started_outside_any_task_may_wait_with_a_timeout() -> None:
    """As a transport starts a handler, from a protocol callback: ``wait_for`` with a timeout
    in the first step works (on 3.12 it is built on ``asyncio.timeout``, which needs a task)."""
    outcome: list[object] = []

    async def drains(event: asyncio.Event) -> None:
        await asyncio.wait_for(event.wait(), 1.0)
        outcome.append("drained")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        event.set()  # already idle (on 3.11 the wait still takes a task of its own)
        started: list[asyncio.Task[None] | None] = []
        loop.call_soon(lambda: started.append(eager.start(drains(event), loop)))
        await asyncio.sleep(0)
        assert len(started) == 1  # (an error in the callback would have left it empty)
        if started[0] is not None:
            await started[0]
        assert outcome == ["drained"]

    event_loop.run(main())


@pytest.mark.skipif(sys.version_info < (3, 12), reason="3.11 has no eager tasks")
def test_from_3_12_the_first_step_runs_inside_the_task_it_returns() -> None:
    seen: list[asyncio.Task[object] | None] = []

    async def work(future: asyncio.Future[None]) -> None:
        seen.append(asyncio.current_task())
        await future

    async def main() -> None:
        future = asyncio.get_running_loop().create_future()
        task = eager.start(work(future), asyncio.get_running_loop())
        assert task is not None
        assert seen == [task]  # not the caller's task
        future.set_result(None)
        await task

    event_loop.run(main())
