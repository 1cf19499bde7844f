"""Benchmark one call handed from the event loop to a model instance's thread and back.

Under dynamic batching most batches run on their instance's worker thread, and every execution
of a python model does, so what the hand-over costs the process is paid per batch. This times
``server.threads.WorkerThread`` (the instances' thread) beside the baseline it replaced: a
one-thread ``ThreadPoolExecutor`` reached through ``loop.run_in_executor`` and awaited through
``asyncio.shield``. Each cell awaits ``--calls`` calls in a row of a function that returns at
once, on the servers' event loop (uvloop where installed), and reports the process's CPU time
and the wall-clock time per call, ``--repeat`` times, the two alternating.

    python scripts/bench_thread_hop.py [--calls 20000] [--repeat 5] [--json FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file: make the `scripts` package importable
    sys.path.insert(0, str(ROOT))

from scripts.bench_common import machine_facts, markdown_table
from server import event_loop
from server.threads import WorkerThread

WORKER, POOL = CELLS = ("WorkerThread", "ThreadPoolExecutor(1) + run_in_executor + shield")


def _next(value: int) -> int:
    return value + 1


async def _through_worker(worker: WorkerThread, calls: int) -> int:
    value = 0
    for _ in range(calls):
        value = await worker.run(_next, value)
    return value


async def _through_pool(pool: ThreadPoolExecutor, calls: int) -> int:
    loop = asyncio.get_running_loop()
    value = 0
    for _ in range(calls):
        value = await asyncio.shield(loop.run_in_executor(pool, _next, value))
    return value


async def measure(calls: int, repeat: int) -> dict[str, dict[str, list[float]]]:
    """CPU and wall-clock µs per call for each cell, one figure per repeat."""
    figures: dict[str, dict[str, list[float]]] = {
        cell: {"cpu": [], "wall": []} for cell in CELLS
    }
    worker = WorkerThread("hop")
    pool = ThreadPoolExecutor(max_workers=1)
    try:
        await _through_worker(worker, 200)  # the threads started, the code warm
        await _through_pool(pool, 200)
        for _ in range(repeat):
            for cell in CELLS:
                cpu, wall = time.process_time(), time.perf_counter()
                if cell == WORKER:
                    counted = await _through_worker(worker, calls)
                else:
                    counted = await _through_pool(pool, calls)
                if counted != calls:
                    raise SystemExit(f"bench_thread_hop: {cell} returned {counted}")
                figures[cell]["cpu"].append((time.process_time() - cpu) / calls * 1e6)
                figures[cell]["wall"].append((time.perf_counter() - wall) / calls * 1e6)
    finally:
        worker.stop()
        pool.shutdown()
    return figures


def report(figures: dict[str, dict[str, list[float]]], args: argparse.Namespace) -> str:
    def cell(values: list[float]) -> str:
        return f"{min(values):.1f} / {statistics.median(values):.1f}"

    rows = [[name, cell(f["cpu"]), cell(f["wall"])] for name, f in figures.items()]
    ratio = statistics.median(figures[POOL]["cpu"]) / statistics.median(figures[WORKER]["cpu"])
    facts = machine_facts()
    title = (
        f"### A call handed to a thread and awaited, {args.calls} in a row (µs per call; "
        f"min / median of {args.repeat})\n"
    )
    loop = "uvloop" if event_loop.loop_factory() else "asyncio"
    machine = (
        f"{facts['nproc']} CPUs ({facts['cpu']}), Python {facts['python']}, on {loop}'s "
        f"loop, load average {facts['load_average_1min']}."
    )
    return "\n".join([
        title,
        markdown_table(["hand-over", "process CPU", "wall clock"], rows),
        f"\nThe baseline costs {ratio:.2f}× WorkerThread's CPU (medians).",
        machine,
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    figures = event_loop.run(measure(args.calls, args.repeat))
    print(report(figures, args))
    if args.json is not None:
        args.json.write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
