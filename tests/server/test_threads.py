"""``WorkerThread``: calls run on its thread in order, results and errors reach the caller, and a
cancelled caller is let go only once the thread is done with its call (the call may be reading
the caller's buffers)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from server.threads import WorkerThread, run_in_thread


def test_calls_run_on_the_thread_in_order_and_return_their_values() -> None:
    worker = WorkerThread("model-0")
    seen: list[tuple[int, str]] = []

    def call(index: int) -> int:
        seen.append((index, threading.current_thread().name))
        return index * 2

    async def main() -> list[int]:
        return list(await asyncio.gather(*(worker.run(call, i) for i in range(20))))

    try:
        assert asyncio.run(main()) == [i * 2 for i in range(20)]
    finally:
        worker.stop()
    assert seen == [(i, "model-0") for i in range(20)]


def test_an_error_in_the_call_is_raised_to_the_caller_and_the_thread_goes_on() -> None:
    worker = WorkerThread("failing-0")

    def fail() -> None:
        raise ValueError("bad input")

    async def main() -> int:
        with pytest.raises(ValueError, match="bad input"):
            await worker.run(fail)
        return await worker.run(int, "7")

    try:
        assert asyncio.run(main()) == 7
    finally:
        worker.stop()


def test_a_cancelled_caller_waits_until_the_thread_is_done_with_its_call() -> None:
    worker = WorkerThread("slow-0")
    running, release = threading.Event(), threading.Event()
    told: list[str] = []

    def slow() -> str:
        running.set()
        release.wait(10)
        return "done"

    async def main() -> None:
        task = asyncio.create_task(worker.run(slow, on_cancel=lambda: told.append("cancel")))
        while not running.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        await asyncio.sleep(0.05)
        task.cancel()  # again: still waits
        await asyncio.sleep(0.05)
        assert not task.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    try:
        asyncio.run(main())
    finally:
        worker.stop()
    assert told == ["cancel"]


def test_a_stop_runs_what_is_queued_then_refuses_new_calls() -> None:
    worker = WorkerThread("stopping-0")
    release = threading.Event()
    done: list[int] = []

    async def main() -> None:
        first = asyncio.create_task(worker.run(release.wait, 10))
        second = asyncio.create_task(worker.run(done.append, 2))
        await asyncio.sleep(0.05)
        worker.stop(wait=False)
        with pytest.raises(RuntimeError, match="stopping-0 is stopped"):
            await worker.run(done.append, 3)
        release.set()
        await asyncio.gather(first, second)

    asyncio.run(main())
    worker.stop()  # (again: nothing to do)
    assert done == [2]


def test_a_call_whose_loop_has_closed_leaves_the_thread_serving() -> None:
    worker = WorkerThread("orphan-0")
    release = threading.Event()
    loop = asyncio.new_event_loop()
    abandoned = loop.create_task(worker.run(release.wait, 10))
    loop.run_until_complete(asyncio.sleep(0.05))
    loop.close()  # its task never finishes; the thread cannot hand it its result
    release.set()

    async def main() -> int:
        return await asyncio.wait_for(worker.run(len, "abc"), 10)  # (a dead thread: a hang)

    try:
        assert asyncio.run(main()) == 3
    finally:
        worker.stop()
    assert not abandoned.done()


def test_run_in_thread_lets_a_cancellation_through_once_the_pool_is_done() -> None:
    running, release = threading.Event(), threading.Event()

    def slow() -> None:
        running.set()
        release.wait(10)

    async def main() -> None:
        task = asyncio.create_task(run_in_thread(slow))
        while not running.is_set():
            await asyncio.sleep(0.005)
        task.cancel()
        await asyncio.sleep(0.05)
        assert not task.done()
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
