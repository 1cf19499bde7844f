"""Benchmark tensorgate's HTTP/REST inference path against baselines measured in the same run.

Prints requests/s and p50/p99 latency for the ``simple`` add/sub model (JSON and binary, concurrency
1 and 8) and MB/s for 16 MiB FP32 identity round trips, each next to (a) a direct ONNX Runtime
``InferenceSession.run`` on the same model file and inputs and (b) a plain socket echo, on the
server's event loop, moving the same bytes at the same concurrency. Figures are for people, never
a CI gate: on a shared 2-core machine only the ratios carry from one run to the next.

    python scripts/bench_http.py [--seconds 5] [--url HOST:PORT] [--json results.json]

Without ``--url`` it starts ``python -m server`` on the example repository on 127.0.0.1 and a free
port, with BLAS/OpenMP and ONNX Runtime pinned to one thread, and stops it (SIGTERM) at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file: make the `scripts` package importable
    sys.path.insert(0, str(ROOT))

from scripts.bench_common import (
    LOOPBACK_SERVER_ARGS,
    PINNED_THREADS,
    EchoFraming,
    EchoServer,
    Sample,
    add_run_options,
    check_run_options,
    echo_request,
    fmt_number,
    fmt_ratio,
    machine_facts,
    markdown_table,
    measure,
    ort_baseline,
)

os.environ.update(PINNED_THREADS)  # before numpy and onnxruntime start their thread pools

import numpy as np
import numpy.typing as npt

from server.loadtest.clients import HttpFraming  # shared with tensorgate-bench

REPOSITORY = ROOT / "examples" / "model_repository"
SERVER_ARGS = (f"--model-repository={REPOSITORY}", *LOOPBACK_SERVER_ARGS)
_STARTED = re.compile(r"Started HTTPService at \S+:(\d+)")
_GRPC_STARTED = re.compile(r"Started GRPCInferenceService at \S+:(\d+)")
_WARNING_OR_ERROR = re.compile(r"^\S+ \S+ [WE] ")
_LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d ")
_V2_DATATYPE = {np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32"}
_MB = 1e6


@dataclass(frozen=True)
class Workload:
    """One model with its inputs, the outputs it must answer, and how requests are encoded."""

    label: str
    model: str
    binary: bool
    concurrencies: tuple[int, ...]
    inputs: dict[str, npt.NDArray[Any]]
    expected: dict[str, npt.NDArray[Any]]
    reports_bandwidth: bool

    @property
    def payload_bytes(self) -> int:
        """Tensor bytes each way (inputs in; the identity answers as many)."""
        return sum(array.nbytes for array in self.inputs.values())


def workloads() -> list[Workload]:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = (3 * np.arange(16, dtype=np.int32) - 20).reshape(1, 16)
    simple = {"INPUT0": a, "INPUT1": b}
    added = {"OUTPUT0": a + b, "OUTPUT1": a - b}
    tensor = np.random.default_rng(0).standard_normal((1, 4 * 1024 * 1024), dtype=np.float32)
    return [
        Workload("simple JSON", "simple", False, (1, 8), simple, added, False),
        Workload("simple binary", "simple", True, (1, 8), simple, added, False),
        Workload(
            "identity_fp32 16 MiB binary",
            "identity_fp32",
            True,
            (1,),
            {"INPUT0": tensor},
            {"OUTPUT0": tensor},
            True,
        ),
    ]


# --- HTTP encoding, framing and checks ------------------------------------------------------


def encode_request(host: str, workload: Workload) -> bytes:
    """The whole request, encoded once and sent as-is every time."""
    outputs = sorted(workload.expected)
    inputs: list[dict[str, Any]] = []
    for name, array in workload.inputs.items():
        spec: dict[str, Any] = {
            "name": name,
            "datatype": _V2_DATATYPE[array.dtype],
            "shape": list(array.shape),
        }
        if workload.binary:
            spec["parameters"] = {"binary_data_size": array.nbytes}
        else:
            spec["data"] = array.ravel().tolist()
        inputs.append(spec)
    headers = [f"POST /v2/models/{workload.model}/infer HTTP/1.1", f"Host: {host}"]
    if workload.binary:
        requested = [{"name": n, "parameters": {"binary_data": True}} for n in outputs]
        head = json.dumps({"inputs": inputs, "outputs": requested}, separators=(",", ":")).encode()
        body = head + b"".join(array.tobytes() for array in workload.inputs.values())
        headers += [
            "Content-Type: application/octet-stream",
            f"Inference-Header-Content-Length: {len(head)}",
        ]
    else:
        requested = [{"name": n} for n in outputs]
        body = json.dumps({"inputs": inputs, "outputs": requested}, separators=(",", ":")).encode()
        headers.append("Content-Type: application/json")
    headers.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(headers) + "\r\n\r\n").encode() + body


def check_response(raw: bytes, workload: Workload) -> list[str]:
    """Problems with one full HTTP response (status, outputs, values); empty when correct."""
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line, *header_lines = head.decode("latin-1").split("\r\n")
    if status_line.split()[1] != "200":
        return [f"{status_line}: {body[:300]!r}"]
    headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in header_lines)}
    header_length = int(headers.get("inference-header-content-length", len(body)))
    document = json.loads(body[:header_length])
    problems = []
    offset = header_length
    seen = set()
    for output in document.get("outputs", []):
        name = output["name"]
        seen.add(name)
        dtype = next(d for d, v2 in _V2_DATATYPE.items() if v2 == output["datatype"])
        size = output.get("parameters", {}).get("binary_data_size")
        if size is None:
            if workload.binary:
                problems.append(f"{name} came back as JSON, binary_data was asked for")
            value = np.array(output["data"], dtype=dtype).reshape(output["shape"])
        else:
            value = np.frombuffer(body, dtype, size // dtype.itemsize, offset).reshape(
                output["shape"]
            )
            offset += size
        expected = workload.expected.get(name)
        if expected is None or value.shape != expected.shape or not np.array_equal(value, expected):
            problems.append(f"{name} has wrong values or shape {output['shape']}")
    if seen != set(workload.expected):
        problems.append(f"outputs {sorted(seen)}, expected {sorted(workload.expected)}")
    if offset != len(body):
        problems.append(f"{len(body) - offset} unexplained bytes after the outputs")
    return problems


def http_problems(sample: Sample, workload: Workload) -> list[str]:
    """What is wrong with an HTTP measurement's first answer (or that there was none)."""
    if not sample.first_response:
        return ["no response at all"]
    return check_response(sample.first_response, workload)


# --- the server under test ------------------------------------------------------------------


class ServerUnderTest:
    """``python -m server`` as a user starts it; its log is kept to report what it said."""

    def __init__(
        self,
        timeout: float = 60.0,
        repositories: list[Path] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        """``repositories`` replace the example repository (bench_batching's models);
        ``extra_args`` are more server flags (bench_shm's ``--allow-client-shm``)."""
        args = list(SERVER_ARGS)
        if repositories is not None:
            args = [a for a in args if not a.startswith("--model-repository")]
            args += [f"--model-repository={repository}" for repository in repositories]
        args += extra_args
        self.lines: list[str] = []
        self.started_at_line = 0
        self._port: int | None = None
        self._grpc_port: int | None = None
        self._started = threading.Event()
        self._grpc_started = threading.Event()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server", *args],
            cwd=ROOT,
            env={**os.environ, **PINNED_THREADS, "PYTHONUNBUFFERED": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not self._started.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the server did not start:\n" + "".join(self.lines[-30:]))
        try:
            self._wait_ready(deadline)
        except RuntimeError:
            self.stop()
            raise

    @property
    def address(self) -> tuple[str, int]:
        assert self._port is not None
        return ("127.0.0.1", self._port)

    def grpc_address(self, timeout: float = 60.0) -> tuple[str, int]:
        """The gRPC endpoint, once the server has logged it (it starts after HTTP)."""
        deadline = time.monotonic() + timeout
        while not self._grpc_started.wait(0.05):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the gRPC service did not start:\n" + "".join(self.lines[-30:]))
        assert self._grpc_port is not None
        return ("127.0.0.1", self._grpc_port)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            match = _STARTED.search(line)
            if match and self._port is None:
                self._port = int(match.group(1))
                self.started_at_line = len(self.lines)
                self._started.set()
            match = _GRPC_STARTED.search(line)
            if match and self._grpc_port is None:
                self._grpc_port = int(match.group(1))
                self._grpc_started.set()

    def _wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            connection = http.client.HTTPConnection(*self.address, timeout=5)
            try:
                connection.request("GET", "/v2/health/ready")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                pass
            finally:
                connection.close()
            time.sleep(0.05)
        raise RuntimeError("the server never became ready")

    def notable_log_lines(self) -> list[str]:
        """Warnings, errors and anything off the log format (tracebacks) since it started."""
        return [
            line.rstrip()
            for line in self.lines[self.started_at_line :]
            if _WARNING_OR_ERROR.match(line) or not _LOG_LINE.match(line)
        ]

    def stop(self) -> None:
        """SIGTERM the process this object started, and only it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)


# --- the run --------------------------------------------------------------------------------


@dataclass
class Cell:
    """One workload at one concurrency: tensorgate and both baselines."""

    workload: Workload
    concurrency: int
    request_bytes: int
    server: Sample
    problems: list[str]
    ort: Sample
    echo: Sample | None


def run_cells(
    address: tuple[str, int], server_pid: int | None, seconds: float, max_requests: int
) -> list[Cell]:
    host = f"{address[0]}:{address[1]}"
    ort_samples: dict[str, Sample] = {}
    cells: list[Cell] = []
    echo = EchoServer()
    try:
        for workload in workloads():
            if workload.model not in ort_samples:
                model_file = REPOSITORY / workload.model / "1" / "model.onnx"
                sample, outputs = ort_baseline(model_file, workload.inputs, seconds, max_requests)
                wrong = [
                    n for n, v in workload.expected.items() if not np.array_equal(outputs[n], v)
                ]
                if wrong:
                    raise RuntimeError(
                        f"ONNX Runtime itself answers {workload.model} {wrong} wrong"
                    )
                ort_samples[workload.model] = sample
            request = encode_request(host, workload)
            capacity = len(request) + (1 << 16)
            for concurrency in workload.concurrencies:
                served = measure(
                    address,
                    request,
                    HttpFraming(),
                    concurrency,
                    seconds,
                    max_requests,
                    capacity,
                    server_pid,
                )
                problems = http_problems(served, workload)
                echoed = None
                if served.first_response:
                    reply = len(served.first_response)
                    echoed = measure(
                        echo.address,
                        echo_request(len(request), reply),
                        EchoFraming(reply),
                        concurrency,
                        seconds,
                        max_requests,
                        capacity,
                        echo.pid,
                    )
                cells.append(
                    Cell(
                        workload,
                        concurrency,
                        len(request),
                        served,
                        problems,
                        ort_samples[workload.model],
                        echoed,
                    )
                )
    finally:
        echo.stop()
    return cells


def _throughput(sample: Sample, workload: Workload) -> str:
    text = f"{fmt_number(sample.rate)}/s"
    if workload.reports_bandwidth:
        text += f" ({fmt_number(sample.rate * workload.payload_bytes / _MB)} MB/s)"
    return text


def _per_request_us(cpu: float | None, sample: Sample) -> str:
    if cpu is None or not sample.requests:
        return "n/a"
    return f"{fmt_number(cpu / sample.requests * 1e6)} µs"


def table_rows(cells: list[Cell]) -> list[list[str]]:
    rows = []
    for cell in cells:
        served, workload = cell.server, cell.workload
        ort_figure = (
            f"{_throughput(cell.ort, workload)}, p50 {fmt_number(cell.ort.percentile_ms(0.5))} ms"
        )
        rows.append(
            [
                workload.label + ("" if not cell.problems else " **WRONG**"),
                str(cell.concurrency),
                _throughput(served, workload),
                fmt_number(served.percentile_ms(0.5)),
                fmt_number(served.percentile_ms(0.99)),
                "ORT `run`, in-process, 1 caller",
                ort_figure,
                fmt_ratio(served.rate / cell.ort.rate),
            ]
        )
        if cell.echo is not None:
            reply = len(served.first_response)
            rows.append(
                [
                    "",
                    "",
                    "",
                    "",
                    "",
                    f"socket echo, {cell.request_bytes:,} B → {reply:,} B",
                    f"{_throughput(cell.echo, workload)}, p50 {fmt_number(cell.echo.percentile_ms(0.5))} ms",
                    fmt_ratio(served.rate / cell.echo.rate),
                ]
            )
    return rows


def report(cells: list[Cell], facts: dict[str, str], args: argparse.Namespace) -> str:
    pinning = ", ".join(f"{k}=1" for k in PINNED_THREADS)
    target = args.url or "tensorgate started by this script (`python -m server`)"
    lines = [
        "## tensorgate HTTP benchmark",
        "",
        f"- server: {target}",
        (
            f"- machine: nproc {facts['nproc']} ({facts['cpu']}), Python {facts['python']}, "
            f"onnxruntime {facts['onnxruntime']}, {facts['platform']}; load average "
            f"{facts['load_average_1min']} at start"
        ),
        (
            f"- thread pinning: {pinning} for the server, the echo server and this process; "
            "server `--backend-config=onnxruntime,intra_op_thread_count=1`; "
            "ORT baseline `intra_op_num_threads=1`, `inter_op_num_threads=1`"
        ),
        (
            "- load generator: one Python thread, non-blocking sockets, HTTP/1.1 keep-alive, one "
            "connection per concurrency slot, requests pre-encoded. **Client and server share "
            f"the same {facts['nproc']} cores**, so every figure includes the client's CPU cost."
        ),
        (
            f"- {args.seconds:g} s per cell after a short warm-up (cap {args.max_requests:,} "
            "requests); ratio = tensorgate req/s ÷ baseline rate; MB = 10^6 bytes of tensor "
            "payload each way; the ORT baseline is one in-process caller, the same figure at "
            "every concurrency; the echo baseline runs at the row's concurrency."
        ),
        "",
        markdown_table(
            [
                "workload",
                "concurrency",
                "tensorgate req/s",
                "p50 ms",
                "p99 ms",
                "baseline",
                "baseline figure",
                "ratio",
            ],
            table_rows(cells),
        ),
        "",
        "Checks and CPU per request (server, echo server, client = this process):",
    ]
    for cell in cells:
        served = cell.server
        verdict = "first response correct" if not cell.problems else "; ".join(cell.problems)
        echo_cpu = (
            _per_request_us(cell.echo.server_cpu, cell.echo) if cell.echo is not None else "n/a"
        )
        lines.append(
            f"- {cell.workload.label} ×{cell.concurrency}: {served.requests:,} requests, "
            f"{served.errors} errors, {verdict}; server {_per_request_us(served.server_cpu, served)}"
            f", echo server {echo_cpu}, client {_per_request_us(served.client_cpu, served)}"
        )
    return "\n".join(lines)


def to_json(cells: list[Cell], facts: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "machine": facts,
        "thread_pinning": PINNED_THREADS,
        "seconds": args.seconds,
        "max_requests": args.max_requests,
        "server": args.url or "tensorgate (started by the script)",
        "cells": [
            {
                "workload": cell.workload.label,
                "concurrency": cell.concurrency,
                "request_bytes": cell.request_bytes,
                "response_bytes": len(cell.server.first_response),
                "problems": cell.problems,
                "tensorgate": cell.server.figures(cell.workload.payload_bytes),
                "ort": cell.ort.figures(cell.workload.payload_bytes),
                "echo": None if cell.echo is None else cell.echo.figures(cell.workload.payload_bytes),
            }
            for cell in cells
        ],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser, max_requests=200_000)
    parser.add_argument(
        "--url", help="HOST:PORT of an already running V2 server to bench instead of starting one"
    )
    args = parser.parse_args(argv)
    check_run_options(parser, args)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    facts = machine_facts()
    server = None
    if args.url:
        host, _, port = args.url.removeprefix("http://").rpartition(":")
        address = (host, int(port))
    else:
        server = ServerUnderTest()
        address = server.address
    try:
        cells = run_cells(
            address, server.proc.pid if server else None, args.seconds, args.max_requests
        )
    finally:
        if server is not None:
            server.stop()
    print(report(cells, facts, args))
    if server is not None:
        notable = server.notable_log_lines()
        print(f"\nServer log during the run: {len(notable)} warning/error/stray lines")
        for line in notable[:20]:
            print(f"    {line}")
    if args.json:
        args.json.write_text(json.dumps(to_json(cells, facts, args), indent=2) + "\n")
    failed = any(cell.problems or cell.server.errors for cell in cells)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
