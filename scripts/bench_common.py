"""Shared pieces of the ``scripts/bench_*.py`` benchmarks.

A benchmark figure means little on its own on a shared 2-core machine, so every figure is printed
beside a baseline measured in the same run (DESIGN.md, "Testing"): a direct ONNX Runtime call on
the same model file and inputs, and a plain socket echo of the same number of bytes (on the
server's event loop). The load generator is one Python thread driving non-blocking sockets with
pre-encoded requests, so that it costs the shared cores as little as Python allows and costs the
same in front of every server.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import multiprocessing
import os
import platform
import selectors
import socket
import struct
import sys
import sysconfig
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

from server import event_loop  # asyncio, and uvloop where installed
from server.loadtest.measurements import Sample as LoadSample  # standard library only

if TYPE_CHECKING:
    import numpy.typing as npt

# One thread per BLAS/OpenMP pool, for the server and for this process (set before numpy loads):
# on 2 cores, spinning pool threads distort every figure. This module imports neither numpy nor
# onnxruntime at import time so that a benchmark can set these first.
PINNED_THREADS = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
ONE_ORT_THREAD = "--backend-config=onnxruntime,intra_op_thread_count=1"
#: How the benchmarks start tensorgate: every endpoint on loopback and a free port (the default
#: 0.0.0.0:8001 would be public and, with grpcio's SO_REUSEPORT, shared with any other
#: server), ONNX Runtime pinned to one intra-op thread.
LOOPBACK_SERVER_ARGS = (
    "--http-port=0",
    "--http-address=127.0.0.1",
    "--grpc-port=0",
    "--grpc-address=127.0.0.1",
    "--metrics-port=0",
    "--metrics-address=127.0.0.1",
    ONE_ORT_THREAD,
)

_STALL_S = 60.0  # a request still unanswered this long after the cell's end is an error
_ECHO_PREFIX = struct.Struct("<II")  # request length (prefix included), reply length


@dataclass
class Sample(LoadSample):
    """What one timed loop measured (``tensorgate-bench``'s sample, whose nearest-rank
    percentiles it shares), plus the server's CPU time over the loop; times in seconds."""

    server_cpu: float | None = None

    def figures(self, payload_bytes: int) -> dict[str, Any]:
        """The figures of this sample for ``--json`` output (MB = 10^6 bytes each way)."""
        return {
            "requests": self.requests,
            "errors": self.errors,
            "per_s": self.rate,
            "mb_per_s": self.rate * payload_bytes / 1e6,
            "p50_ms": self.percentile_ms(0.5),
            "p99_ms": self.percentile_ms(0.99),
            "server_cpu_us": None
            if self.server_cpu is None or not self.requests
            else self.server_cpu / self.requests * 1e6,
            "client_cpu_us": self.client_cpu / self.requests * 1e6 if self.requests else None,
        }


class Framing(Protocol):
    """How the load generator knows where a response ends and whether it succeeded."""

    def response_length(self, buffer: bytearray, filled: int) -> int | None:
        """The full response length once enough of it has arrived, else None."""

    def ok(self, response: memoryview) -> bool:
        """Whether a complete response counts as a success."""


@dataclass(eq=False)
class _Slot:
    """One keep-alive connection with its receive buffer, reused for every request."""

    sock: socket.socket
    buffer: bytearray
    view: memoryview
    filled: int = 0
    length: int | None = None
    sent: int = 0
    writing: bool = False  # whether the selector also watches for writability
    started: float = 0.0


class LoadGenerator:
    """Closed-loop load: each of ``concurrency`` connections sends the same pre-encoded request
    again as soon as the previous response has arrived in full (no pipelining)."""

    def __init__(
        self,
        address: tuple[str, int],
        request: bytes,
        framing: Framing,
        concurrency: int,
        response_capacity: int,
    ) -> None:
        self._address = address
        self._request = memoryview(request)
        self._framing = framing
        self._capacity = response_capacity
        self._selector = selectors.DefaultSelector()
        self._slots = [self._connect() for _ in range(concurrency)]

    def _connect(self) -> _Slot:
        buffer = bytearray(self._capacity)
        return _Slot(self._open_socket(), buffer, memoryview(buffer))

    def _open_socket(self) -> socket.socket:
        sock = socket.create_connection(self._address, timeout=10)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        return sock

    def close(self) -> None:
        for slot in self._slots:
            slot.sock.close()
        self._selector.close()

    def run(self, seconds: float, max_requests: int, server_pid: int | None = None) -> Sample:
        """Keep every connection busy for ``seconds`` or until ``max_requests`` were sent;
        ``server_pid``'s CPU time over the run is recorded too."""
        sample = Sample()
        server_cpu = None if server_pid is None else cpu_seconds(server_pid)
        client_cpu = time.process_time()
        start = time.perf_counter()
        deadline = start + seconds
        issued = 0
        active: set[_Slot] = set()
        for slot in self._slots[:max_requests]:
            self._selector.register(slot.sock, selectors.EVENT_READ, slot)
            self._start(slot, sample)
            active.add(slot)
            issued += 1
        while active:
            events = self._selector.select(timeout=1.0)
            now = time.perf_counter()
            if not events and now > deadline + _STALL_S:
                sample.errors += len(active)
                for slot in active:
                    self._reconnect(slot)
                    self._selector.unregister(slot.sock)
                break
            for key, mask in events:
                slot = key.data
                done = self._step(slot, mask, sample)
                if not done:
                    continue
                now = time.perf_counter()
                if now < deadline and issued < max_requests:
                    self._start(slot, sample)
                    issued += 1
                else:
                    self._selector.unregister(slot.sock)
                    active.discard(slot)
        sample.elapsed = time.perf_counter() - start
        sample.client_cpu = time.process_time() - client_cpu
        if server_pid is not None and server_cpu is not None:
            sample.server_cpu = cpu_seconds(server_pid) - server_cpu
        return sample

    def _start(self, slot: _Slot, sample: Sample) -> None:
        """Send the request; a connection the server has dropped meanwhile counts as an error
        and is replaced once (a second failure means the server is gone)."""
        for retry in (False, True):
            slot.filled, slot.length, slot.sent = 0, None, 0
            slot.started = time.perf_counter()
            try:
                self._send(slot)
                return
            except OSError:
                if retry:
                    raise
                sample.errors += 1
                self._reconnect(slot)

    def _send(self, slot: _Slot) -> None:
        """Send what the socket takes now; watch for writability only while bytes remain."""
        total = len(self._request)
        try:
            while slot.sent < total:
                slot.sent += slot.sock.send(self._request[slot.sent :])
        except BlockingIOError:
            pass
        writing = slot.sent < total
        if writing != slot.writing:
            slot.writing = writing
            mask = selectors.EVENT_READ | (selectors.EVENT_WRITE if writing else 0)
            self._selector.modify(slot.sock, mask, slot)

    def _step(self, slot: _Slot, mask: int, sample: Sample) -> bool:
        """Advance one connection; True when its request is finished (answered or failed)."""
        try:
            if mask & selectors.EVENT_WRITE:
                self._send(slot)
            if not mask & selectors.EVENT_READ:
                return False
            if slot.filled == len(slot.buffer):
                self._grow(slot, 2 * len(slot.buffer))
            received = slot.sock.recv_into(slot.view[slot.filled :])
            if received == 0:
                raise ConnectionError("connection closed by the server")
            slot.filled += received
            if slot.length is None:
                slot.length = self._framing.response_length(slot.buffer, slot.filled)
                if slot.length is not None and slot.length > len(slot.buffer):
                    self._grow(slot, slot.length)
            if slot.length is None or slot.filled < slot.length:
                return False
            if slot.filled > slot.length:
                raise ConnectionError("bytes after the end of the response")
        except BlockingIOError:
            return False
        except OSError:
            sample.errors += 1
            self._reconnect(slot)
            return True
        sample.latencies.append(time.perf_counter() - slot.started)
        sample.requests += 1
        response = slot.view[: slot.length]
        if not sample.first_response:
            sample.first_response = bytes(response)
        if not self._framing.ok(response):
            sample.errors += 1
        if slot.sent < len(self._request):  # answered early: the rest of the request is moot
            self._reconnect(slot)
        return True

    def _grow(self, slot: _Slot, size: int) -> None:
        buffer = bytearray(size)
        buffer[: slot.filled] = slot.view[: slot.filled]
        slot.view.release()
        slot.buffer, slot.view = buffer, memoryview(buffer)

    def _reconnect(self, slot: _Slot) -> None:
        """Replace a failed connection in place, so the slot keeps its place in the loop."""
        self._selector.unregister(slot.sock)
        slot.sock.close()
        slot.sock, slot.filled, slot.length, slot.writing = self._open_socket(), 0, None, False
        self._selector.register(slot.sock, selectors.EVENT_READ, slot)


def measure(
    address: tuple[str, int],
    request: bytes,
    framing: Framing,
    concurrency: int,
    seconds: float,
    max_requests: int,
    response_capacity: int,
    server_pid: int | None,
    before_timed: Callable[[], object] | None = None,
) -> Sample:
    """First one request alone (its response is the one to verify), then a short warm-up, then
    the timed run; the returned sample carries that first response. ``before_timed`` is called
    once the warm-up's requests are all answered, just before the timed run starts (to read
    server counters that the timed run alone should move)."""
    generator = LoadGenerator(address, request, framing, concurrency, response_capacity)
    try:
        first = generator.run(seconds, 1)
        generator.run(min(0.5, seconds / 5), max_requests)
        if before_timed is not None:
            before_timed()
        sample = generator.run(seconds, max_requests, server_pid)
    finally:
        generator.close()
    sample.first_response = first.first_response
    return sample


# --- socket echo baseline -------------------------------------------------------------------


class EchoFraming:
    """The echo server's reply has a length fixed by the request prefix."""

    def __init__(self, reply_length: int) -> None:
        self._reply_length = reply_length

    def response_length(self, buffer: bytearray, filled: int) -> int | None:
        return self._reply_length

    def ok(self, response: memoryview) -> bool:
        return True


def echo_request(request_length: int, reply_length: int) -> bytes:
    """A message of exactly ``request_length`` bytes asking for ``reply_length`` bytes back, so
    the echo moves what the HTTP round trip moved."""
    assert request_length >= _ECHO_PREFIX.size
    return _ECHO_PREFIX.pack(request_length, reply_length) + bytes(
        request_length - _ECHO_PREFIX.size
    )


class _EchoProtocol(asyncio.BufferedProtocol):
    """Reads a length-prefixed message into a reused buffer and writes it back (cut or
    zero-padded to the reply length asked for): what Python sockets cost with no serving."""

    def __init__(self) -> None:
        self._buffer = bytearray(1 << 16)
        self._view = memoryview(self._buffer)
        self._filled = 0
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._filled == len(self._buffer):
            self._grow(2 * len(self._buffer))
        return self._view[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        if self._filled < _ECHO_PREFIX.size:
            return
        total, reply = _ECHO_PREFIX.unpack_from(self._buffer)
        if total > len(self._buffer):
            self._grow(total)
        if self._filled < total:
            return
        assert self._transport is not None
        self._transport.write(self._view[: min(total, reply)])
        if reply > total:
            self._transport.write(bytes(reply - total))
        self._filled = 0

    def _grow(self, size: int) -> None:
        buffer = bytearray(size)
        buffer[: self._filled] = self._view[: self._filled]
        self._view.release()
        self._buffer, self._view = buffer, memoryview(buffer)


def _echo_main(port_pipe: Connection) -> None:
    async def serve() -> None:
        server = await asyncio.get_running_loop().create_server(_EchoProtocol, "127.0.0.1", 0)
        port_pipe.send(server.sockets[0].getsockname()[1])
        await asyncio.Event().wait()  # until the parent terminates this process

    event_loop.run(serve())  # the loop the server runs on: its sockets cost what the server's do


class EchoServer:
    """An echo server in a child process of its own, as a server would be. ``main`` serves
    on a free loopback port and sends that port through the pipe it is given."""

    def __init__(
        self, main: Callable[[Connection], None] = _echo_main, what: str = "echo server"
    ) -> None:
        context = multiprocessing.get_context("spawn")
        receiver, sender = context.Pipe(duplex=False)
        self._process = context.Process(target=main, args=(sender,), daemon=True)
        self._process.start()
        if not receiver.poll(30):
            self.stop()
            raise RuntimeError(f"the {what} did not start")
        self.address = ("127.0.0.1", int(receiver.recv()))

    @property
    def pid(self) -> int:
        assert self._process.pid is not None
        return self._process.pid

    def stop(self) -> None:
        """SIGTERM the child this object started, and only it."""
        self._process.terminate()
        self._process.join(10)


# --- direct ONNX Runtime baseline -----------------------------------------------------------


def ort_baseline(
    model_file: Path,
    inputs: Mapping[str, npt.NDArray[Any]],
    seconds: float,
    max_calls: int,
) -> tuple[Sample, dict[str, npt.NDArray[Any]]]:
    """Time ``InferenceSession.run`` in this process, one intra-op thread like the server's:
    the cost of the model itself, which serving adds to."""
    import onnxruntime as ort  # after the caller pinned threads

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(model_file), options, providers=["CPUExecutionProvider"])
    names = [output.name for output in session.get_outputs()]
    feed = dict(inputs)
    outputs = dict(zip(names, session.run(names, feed), strict=True))
    sample = Sample()
    client_cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    while sample.requests < max_calls:
        began = time.perf_counter()
        session.run(names, feed)
        ended = time.perf_counter()
        sample.latencies.append(ended - began)
        sample.requests += 1
        if ended >= deadline:
            break
    sample.elapsed = time.perf_counter() - start
    sample.client_cpu = time.process_time() - client_cpu
    return sample, outputs


# --- report ---------------------------------------------------------------------------------


def machine_facts() -> dict[str, str]:
    """What a reader needs to compare figures between runs."""
    import onnxruntime as ort

    cpu = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": str(len(os.sched_getaffinity(0))),
        "cpu": cpu,
        "python": f"{python_version()} ({python_build()})",
        "onnxruntime": ort.__version__,
        "platform": platform.platform(),
        # Other work on the same cores shifts every figure; this says how busy they were.
        "load_average_1min": f"{os.getloadavg()[0]:.2f}",
    }


def python_version() -> str:
    """This interpreter's version, as ``3.11.7``."""
    return sys.version.split()[0]


def interpreter_line(server: str) -> str:
    """The line under a benchmark's tables that names the interpreter, which ``server``'s
    processes (started by the benchmark) run too."""
    return f"python {python_version()} ({server}'s too): {python_build()}."


def python_build(maps: str | None = None, config_args: str | None = None) -> str:
    """How the interpreter running the benchmark (and the servers it starts) was built, as far
    as that moves every figure: the same server code spent 12-15 % less CPU per small request on
    Debian's python3.11, whose executable has the interpreter linked in, than on a pyenv build
    that loads it from ``libpython3.11.so`` without profile-guided optimisation. ``maps`` and
    ``config_args`` stand in for ``/proc/self/maps`` and ``CONFIG_ARGS`` in tests."""
    if maps is None:
        try:
            maps = Path("/proc/self/maps").read_text()
        except OSError:
            maps = ""
    if not maps:
        linking = "libpython linking unknown"
    elif any(Path(fields[5]).name.startswith("libpython")
             for fields in (line.split(maxsplit=5) for line in maps.splitlines())
             if len(fields) == 6):  # address, mode, offset, device, inode, path
        linking = "libpython loaded as a shared library"
    else:
        linking = "interpreter linked into the executable"
    if config_args is None:
        config_args = str(sysconfig.get_config_var("CONFIG_ARGS") or "")
    flags = [flag for flag in ("--enable-optimizations", "--with-lto")
             if any(arg.strip("'\"").startswith(flag) for arg in config_args.split())]
    configured = (f"configured with {' '.join(flags)}" if flags
                  else "configured without --enable-optimizations or --with-lto")
    return f"{linking}; {configured}"


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def fmt_number(value: float) -> str:
    """Three significant figures or so, without exponents, thousands separated."""
    if math.isnan(value):
        return "n/a"
    if value >= 100:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    if value >= 1:
        return f"{value:.2f}"
    return f"{value:.3f}"


def fmt_ratio(value: float) -> str:
    return f"{value:.3g}×" if value > 0 else "n/a"


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def add_run_options(parser: argparse.ArgumentParser, max_requests: int) -> None:
    """The options every benchmark takes: timed seconds, a request cap, a JSON output."""
    parser.add_argument("--seconds", type=float, default=5.0, help="timed seconds per cell")
    parser.add_argument(
        "--max-requests",
        type=int,
        default=max_requests,
        help="request cap per cell (and ORT calls)",
    )
    parser.add_argument("--json", type=Path, help="also write the results to this file")


def check_run_options(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse run options that would measure nothing."""
    if args.seconds <= 0 or args.max_requests < 1:
        parser.error("--seconds and --max-requests must be positive")
