"""Benchmark the executor's side of the seam, beside the floor under it.

Issue 15 gives the executor 30 µs of CPU per unbatched small request. ``bench_vs_triton.py``
measures it under perf_analyzer, where the figure moves with everything else sharing the cores.
This benchmark holds the rest still. A driver (in this process, or in one of its own) sends
pre-encoded ``Infer`` messages for the example ``simple`` model (INT32 [1,16] twice, inline) over
a real Unix socket to a real ``ExecutorService`` (repository, ``DataPlane``, ONNX Runtime on one
intra-op thread), and counts the ``Done`` answers. The floor is the same driver against a bare
server on the same kind of socket and ``Channel``. That server decodes each message, runs the same
ONNX Runtime session on the inline bytes and sends back a ``Done``, which any executor has to do.
The difference between the two is what the executor's layers add: validation, scheduling,
statistics, arenas.

Both servers run as the executor's process does: on its event loop (``server.event_loop``:
uvloop where it is installed), under its CPU policy (``SCHED_BATCH``, which the driver's process
inherits, as front ends have it) and with its collector settings once serving (``heap``). Three
cells, each timed ``--repeat`` times, each server in turn:

- ``pipelined``: ``--depth`` requests in flight, each answer followed at once by the next
  request, so the process never waits and its caches stay warm;
- ``driver apart``: as ``pipelined``, but the driver is this script in a process of its own,
  on another core where there is one (each process pinned to its core for the run). The figure
  is the server's process alone, as an executor with a core to itself on a many-core host
  spends: no driver in it, but every message crosses between cores.
- ``after idle``: the driver apart, one request at a time, each sent ``--gap-us`` after the
  previous answer (the driver sleeps; loop timers cannot: uvloop's count whole milliseconds and
  round 200 µs down to none). The server blocks on its socket between requests and wakes up for
  each, as an executor at low load does. The code is the same; only the block in between
  differs.

Beside them, ``wake alone``: the server's process blocked on a socket that the process apart
writes one byte to, ``--gap-us`` apart, with nothing else to do. It is what blocking and waking
up costs this process on this machine whatever it runs; the ``after idle`` cell holds it and
the code run after each wake-up, whose caches may have gone cold meanwhile.

Figures are CPU µs per request of the server's process: with the driver's (the same for both
servers) in ``pipelined``, without it in the other two. They are for people, never a CI gate.

    python scripts/bench_executor.py [--repeat 7] [--requests 4000] [--depth 8] [--gap-us 200]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file: make the `scripts` package importable
    sys.path.insert(0, str(ROOT))

from scripts.bench_common import PINNED_THREADS, machine_facts, markdown_table
from server import event_loop, heap

os.environ.update(PINNED_THREADS)  # before numpy and onnxruntime start their thread pools

import msgspec
import numpy as np
import onnxruntime as ort

from backends.onnxruntime.backend import OnnxRuntimeBackend
from server.dataplane import DataPlane
from server.ipc import messages as m
from server.ipc.channel import Channel, receive_hello, send_hello
from server.ipc.service import ExecutorService
from server.memory.arena import Arena
from server.processes.cpu_policy import use_batch_policy
from server.repository.manager import ModelRepository
from server.settings import Settings

MODEL = "simple"
EXAMPLE = ROOT / "examples" / "model_repository" / MODEL
OUTPUTS = ("OUTPUT0", "OUTPUT1")
ARENA_BYTES = 1 << 20
BUDGET_US = 30.0  # issue 15: the executor, per unbatched small request
_LENGTH = struct.Struct("<I")
_TIMEOUT_S = 120.0  # for a run, beyond its gaps (see ``time_limit``)
_DONE_TAG = m.Done.__struct_config__.tag
PIPELINED, APART, AFTER_IDLE = CELLS = ("pipelined", "driver apart", "after idle")


def infer_frames(count: int) -> tuple[list[bytes], np.ndarray, np.ndarray]:
    """``count`` framed ``Infer`` messages (ids 1..count) and their two inputs."""
    first = np.arange(16, dtype=np.int32).reshape(1, 16)
    second = np.full((1, 16), 3, dtype=np.int32)
    encoder = msgspec.msgpack.Encoder()
    frames = []
    for request in range(1, count + 1):
        body = encoder.encode(m.Infer(
            request, MODEL, "", None, {},
            [m.Tensor("INPUT0", "INT32", [1, 16], inline=first.tobytes()),
             m.Tensor("INPUT1", "INT32", [1, 16], inline=second.tobytes())],
            None,
        ))
        frames.append(_LENGTH.pack(len(body)) + body)
    return frames, first, second


class Driver(asyncio.BufferedProtocol):
    """Sends the frames, ``depth`` in flight (or one at a time, ``gap_s`` after each answer:
    a sleep that blocks, in the driver's own process only), and counts the ``Done`` answers by
    their length prefix and tag (the second byte of a short msgpack array); the first is kept
    to be checked."""

    def __init__(self, frames: list[bytes], depth: int, gap_s: float) -> None:
        self._frames = frames
        self._depth = depth
        self._gap_s = gap_s
        self._next = 0
        self._buffer = bytearray(1 << 20)
        self._view = memoryview(self._buffer)
        self._filled = 0
        self._transport: asyncio.Transport | None = None
        self.answers = 0
        self.first: bytes | None = None
        self.done: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def start(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        for _ in range(min(self._depth, len(self._frames))):
            self._send()

    def _send(self) -> None:
        if self._next < len(self._frames) and self._transport is not None:
            self._transport.write(self._frames[self._next])
            self._next += 1

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._view[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        start = 0
        while self._filled - start >= _LENGTH.size:
            (length,) = _LENGTH.unpack_from(self._buffer, start)
            end = start + _LENGTH.size + length
            if end > self._filled:
                break
            if self._buffer[start + _LENGTH.size + 1] != _DONE_TAG:
                start = end  # the executor's greeting (its log settings)
                continue
            if self.first is None:
                self.first = bytes(self._view[start + _LENGTH.size : end])
            start = end
            self.answers += 1
            if self._gap_s and self._next < len(self._frames):
                time.sleep(self._gap_s)  # the process has nothing else to do meanwhile
            self._send()
        remaining = self._filled - start
        self._buffer[:remaining] = self._view[start : self._filled]
        self._filled = remaining
        if self.answers >= len(self._frames) and not self.done.done():
            self.done.set_result(None)

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(f"the server hung up: {exc}"))


async def drive(
    sock: socket.socket, frames: list[bytes], depth: int, gap_s: float
) -> tuple[float, bytes]:
    """CPU seconds of this process per answered request, and the first answer's body."""
    loop = asyncio.get_running_loop()
    driver = Driver(frames, depth, gap_s)
    sock.setblocking(False)
    transport, _ = await loop.connect_accepted_socket(lambda: driver, sock)
    began = time.process_time()
    driver.start(transport)
    await asyncio.wait_for(driver.done, time_limit(len(frames), gap_s))
    spent = time.process_time() - began
    transport.close()
    assert driver.first is not None
    return spent / driver.answers, driver.first


async def apart(
    sock: socket.socket, requests: int, depth: int, gap_us: int, wakes: bool = False
) -> tuple[float, bytes]:
    """``drive`` from a process of its own (this script with ``--drive-fd``), pinned to another
    core than this one where there are two; with ``wakes``, that process writes one byte
    ``gap_us`` apart instead. CPU seconds of this process alone per request (or byte), counted
    from when the driver has built its frames, and the first answer's body (empty for bytes)."""
    cores = sorted(os.sched_getaffinity(0))
    core = driver_core()
    options = [] if core is None else ["--core", str(core)]
    if wakes:
        options.append("--wakes")
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--drive-fd", str(sock.fileno()), "--requests",
        str(requests), "--depth", str(depth), "--gap-us", str(gap_us), *options,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, pass_fds=(sock.fileno(),),
    )
    sock.close()  # the driver's now
    assert child.stdin is not None and child.stdout is not None
    if core is not None:
        os.sched_setaffinity(0, cores[:1])
    answer = b""
    try:
        await asyncio.wait_for(child.stdout.readline(), _TIMEOUT_S)  # its frames are built
        began = time.process_time()
        child.stdin.write(b"go\n")
        await child.stdin.drain()
        answer = await asyncio.wait_for(
            child.stdout.readline(), time_limit(requests, gap_us / 1e6)
        )
        spent = time.process_time() - began
    finally:
        if core is not None:
            os.sched_setaffinity(0, cores)
        if not answer and child.returncode is None:  # a timeout: it is not waited for
            child.kill()
        await child.wait()
    if child.returncode != 0 or not answer:
        raise SystemExit(f"bench_executor: the driver process failed ({child.returncode})")
    return spent / requests, bytes.fromhex(answer.decode())


def time_limit(requests: int, gap_s: float) -> float:
    """How long a run of ``requests`` may take: its gaps twice over (sleeps overshoot), and
    ``_TIMEOUT_S`` for the rest."""
    return _TIMEOUT_S + 2 * requests * gap_s


def driver_core() -> int | None:
    """The core the driver apart is pinned to (this process keeps the first); None on one
    core, where the two share it."""
    cores = sorted(os.sched_getaffinity(0))
    return cores[1] if len(cores) > 1 else None


def run_driver(args: argparse.Namespace) -> None:
    """The process apart: builds its frames, says so, waits for the word, then drives the
    server on the socket ``--drive-fd`` and prints the first answer's body (hex), or with
    ``--wakes`` writes its bytes and prints an empty line."""
    if args.core is not None:
        os.sched_setaffinity(0, {args.core})
    sock = socket.socket(fileno=args.drive_fd)
    if args.wakes:
        print(flush=True)
        sys.stdin.readline()
        for _ in range(args.requests):
            time.sleep(args.gap_us / 1e6)
            sock.sendall(b"w")
        print(flush=True)
        return
    frames, _, _ = infer_frames(args.requests)
    print(flush=True)
    sys.stdin.readline()

    async def driven() -> bytes:
        _, first = await drive(sock, frames, args.depth, args.gap_us / 1e6)
        return first

    print(event_loop.run(driven()).hex(), flush=True)


class FloorServer:
    """Decode, run the ONNX Runtime session, answer: the least an executor does per request."""

    def __init__(self, model_file: Path) -> None:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(
            str(model_file), options, providers=["CPUExecutionProvider"]
        )
        self._names = list(OUTPUTS)
        self._channel: Channel[m.ToExecutor] | None = None

    async def accept(self, sock: socket.socket) -> None:
        self._channel = Channel(m.to_executor_decoder(), self._on_message, _nothing, gather=True)
        await self._channel.attach(sock)

    def _on_message(self, message: m.ToExecutor) -> None:
        assert isinstance(message, m.Infer) and self._channel is not None
        feeds = {
            tensor.name: np.frombuffer(tensor.inline or b"", dtype=np.int32).reshape(tensor.shape)
            for tensor in message.inputs
        }
        results = self._session.run(self._names, feeds)
        self._channel.send(m.Done(
            message.id, MODEL, "1", None, {},
            [m.Tensor(name, "INT32", list(value.shape), inline=value.tobytes())
             for name, value in zip(self._names, results, strict=True)],
        ))


def _nothing() -> None:
    pass


class ExecutorUnderTest:
    """A real ``ExecutorService`` over a repository holding the example ``simple`` model."""

    def __init__(self, root: Path) -> None:
        shutil.copytree(EXAMPLE, root / MODEL)
        self._settings = Settings(
            model_repositories=(str(root),), model_control_mode="explicit", load_models=(MODEL,)
        )
        self._repository = ModelRepository(
            self._settings, {"onnxruntime": OnnxRuntimeBackend({"intra_op_thread_count": "1"})}
        )
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._path = str(root / "control.sock")
        self._serving: asyncio.Task[None] | None = None
        self._arena = Arena.create(ARENA_BYTES)

    async def start(self) -> None:
        await self._repository.load_initial(None)
        dataplane = DataPlane(self._settings, self._repository)
        dataplane.set_live(True)
        self._service = ExecutorService(dataplane, ARENA_BYTES)
        self._listener.bind(self._path)
        self._listener.listen()
        self._serving = asyncio.create_task(self._service.serve(self._listener))

    async def connect(self) -> socket.socket:
        """A front end's connection: introduced with its arena, as ``ExecutorClient`` does."""
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        await loop.run_in_executor(None, sock.connect, self._path)
        hello = m.encoder().encode(m.Hello("frontend", 0, self._arena.size))
        await loop.run_in_executor(None, send_hello, sock, hello, self._arena.fd)
        _, fd = await loop.run_in_executor(None, receive_hello, sock)
        os.close(fd)  # the executor's output arena: inline answers never point into it
        return sock

    async def close(self) -> None:
        self._service.close()
        if self._serving is not None:
            self._serving.cancel()
        self._listener.close()
        await self._repository.close()
        self._arena.close()


async def floor_socket(server: FloorServer) -> socket.socket:
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    await server.accept(theirs)
    return ours


def check_answer(body: bytes, first: np.ndarray, second: np.ndarray) -> None:
    """The first answer is ``simple``'s: the sum and the difference of the inputs."""
    done = msgspec.msgpack.decode(body, type=m.ToFrontEnd)
    if not isinstance(done, m.Done):
        raise SystemExit(f"bench_executor: expected a Done, got {done!r}")
    values = {t.name: np.frombuffer(t.inline or b"", dtype=np.int32) for t in done.outputs}
    expected = {"OUTPUT0": (first + second).ravel(), "OUTPUT1": (first - second).ravel()}
    for name, value in expected.items():
        got = values.get(name)
        if got is None or not np.array_equal(got, value):
            raise SystemExit(f"bench_executor: wrong {name}: {got}")


class Wakes(asyncio.Protocol):
    """Reads the bytes of ``wake alone``, doing nothing with them."""

    def data_received(self, data: bytes) -> None:
        pass


async def wake_alone(count: int, gap_us: int) -> float:
    """CPU seconds of this process per wake-up for one byte on a socket, ``gap_us`` apart,
    nothing else run (as a server waits between the ``after idle`` cell's requests)."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    ours.setblocking(False)
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(Wakes, ours)
    try:
        per_wake, _ = await apart(theirs, count, 1, gap_us, wakes=True)
    finally:
        transport.close()
    return per_wake


async def measure(
    args: argparse.Namespace,
) -> tuple[dict[str, dict[str, list[float]]], list[float]]:
    """µs per request for each cell and server, and µs per ``wake alone``, one figure per
    repeat."""
    frames, first, second = infer_frames(args.requests)
    warm_frames = frames[: min(len(frames), 200)]
    figures: dict[str, dict[str, list[float]]] = {
        cell: {"executor": [], "floor": []} for cell in CELLS
    }
    wakes: list[float] = []
    with tempfile.TemporaryDirectory(prefix="bench-executor-") as folder:
        executor = ExecutorUnderTest(Path(folder))
        await executor.start()
        floor = FloorServer(EXAMPLE / "1" / "model.onnx")
        heap.settle(heap.EXECUTOR_YOUNG_THRESHOLD)  # as the executor's process, once serving
        connect: dict[str, Callable[[], Any]] = {
            "executor": executor.connect, "floor": lambda: floor_socket(floor),
        }
        cells: dict[str, Callable[[socket.socket], Awaitable[tuple[float, bytes]]]] = {
            PIPELINED: lambda sock: drive(sock, frames, args.depth, 0.0),
            APART: lambda sock: apart(sock, args.requests, args.depth, 0),
            AFTER_IDLE: lambda sock: apart(sock, args.requests, 1, args.gap_us),
        }
        try:
            for name, opener in connect.items():  # warm: the runner goes inline after its trials
                for _ in range(3):
                    _, body = await drive(await opener(), warm_frames, args.depth, 0.0)
                    check_answer(body, first, second)
            for _ in range(args.repeat):
                for cell, run in cells.items():
                    for name, opener in connect.items():
                        per_request, body = await run(await opener())
                        check_answer(body, first, second)
                        figures[cell][name].append(per_request * 1e6)
                wakes.append(await wake_alone(args.requests, args.gap_us) * 1e6)
        finally:
            await executor.close()
    return figures, wakes


def loop_name() -> str:
    """The event loop both servers run on, as the report names it."""
    return "asyncio's own loop" if event_loop.loop_factory() is None else "uvloop's loop"


def report(
    figures: dict[str, dict[str, list[float]]],
    wakes: list[float],
    args: argparse.Namespace,
    batch_policy: bool,
) -> str:
    rows = []
    for cell, by_server in figures.items():
        executor, floor = by_server["executor"], by_server["floor"]
        rows.append([
            cell,
            f"{min(executor):.1f} / {statistics.median(executor):.1f}",
            f"{min(floor):.1f} / {statistics.median(floor):.1f}",
            f"{statistics.median(executor) - statistics.median(floor):.1f}",
            f"{statistics.median(executor) / statistics.median(floor):.2f}×",
        ])
    facts = machine_facts()
    title = (
        f"### The executor's side of the seam, `{MODEL}` INT32 [1,16] ×2 inline "
        f"(CPU µs per request of the server's process; min / median of {args.repeat})"
    )
    header = ["cell", "executor", "floor (decode, run, answer)", "executor − floor",
              "executor ÷ floor"]
    where = (
        "its own process (one core here: they share it)" if driver_core() is None
        else "its own process, on another core"
    )
    cells = (
        f"{PIPELINED}: {args.depth} in flight, the driver in the server's process (its CPU "
        f"included); {APART}: {args.depth} in flight, the driver in {where} (its CPU not "
        f"included); {AFTER_IDLE}: the driver apart, one request at a time, {args.gap_us} µs "
        f"after each answer; {args.requests} requests per run, on {loop_name()}, under "
        f"{'SCHED_BATCH' if batch_policy else 'the CPU policy this was started with'}. Issue "
        f"15's budget for the executor: {BUDGET_US:.0f} µs per unbatched small request."
    )
    alone = (
        f"wake alone (blocked on a socket, woken by one byte every {args.gap_us} µs, no "
        f"request): {min(wakes):.1f} / {statistics.median(wakes):.1f} µs of this process's CPU "
        "per wake-up."
    )
    machine = (
        f"{facts['nproc']} CPUs ({facts['cpu']}), Python {facts['python']}, ONNX Runtime "
        f"{facts['onnxruntime']}, load average {facts['load_average_1min']}."
    )
    return "\n".join([title, "", markdown_table(header, rows), "", alone, cells, machine])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per cell and server")
    parser.add_argument("--requests", type=int, default=4000, help="requests per run")
    parser.add_argument("--depth", type=int, default=8, help="requests in flight (pipelined)")
    parser.add_argument("--gap-us", type=int, default=200,
                        help="pause before each request of the 'after idle' cell")
    parser.add_argument("--json", type=Path, help="also write every figure to this file")
    # the driver apart: this script in its own process (see ``apart``)
    parser.add_argument("--drive-fd", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--core", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--wakes", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.drive_fd is not None:
        run_driver(args)
        return 0
    if min(args.repeat, args.requests, args.depth) < 1 or args.gap_us < 1:
        parser.error("--repeat, --requests, --depth and --gap-us must be positive")
    # as the executor's process (and the front ends: the driver inherits it)
    batch_policy = use_batch_policy()
    figures, wakes = event_loop.run(measure(args))
    print(report(figures, wakes, args, batch_policy))
    if args.json is not None:
        args.json.write_text(json.dumps(
            {"figures": figures, "wake_alone": wakes, "args": vars(args) | {"json": None}},
            indent=2,
        ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
