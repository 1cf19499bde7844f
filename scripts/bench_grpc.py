"""Benchmark tensorgate's gRPC inference path beside its HTTP binary path, in one server process.

Prints requests/s and p50/p99 latency for the ``simple`` add/sub model (INT32 [1,16] x2, concurrency
1 and 8) and MB/s for 16 MiB FP32 round trips on ``identity_fp32``, over gRPC (``ModelInfer`` with
``raw_input_contents``) and over HTTP binary, cell by cell against the same server, each next to
(a) a direct ONNX Runtime ``InferenceSession.run`` on the same model file and inputs and (b) a
grpc.aio echo server moving the same request bytes at the same concurrency (what Python gRPC costs
with no serving). Figures are for people, never a CI gate: on a shared 2-core machine only the
ratios carry from one run to the next.

    python scripts/bench_grpc.py [--seconds 5] [--grpc-channels 1] [--no-echo] [--json PATH]

It starts ``python -m server`` on the example repository with HTTP and gRPC on 127.0.0.1 and free
ports, BLAS/OpenMP and ONNX Runtime pinned to one thread (as ``bench_http.py`` does), and stops it
(SIGTERM, by PID) at the end.

The gRPC load generator is as cheap as grpc.aio allows: the ``ModelInferRequest`` is serialized
once and sent as bytes through an identity serializer, responses stay bytes (only the first one of
each workload is parsed and checked), and concurrency N is N coroutines, each keeping one call in
flight on a shared channel (or ``--grpc-channels`` channels, each its own TCP connection).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file: make the `scripts` package importable
    sys.path.insert(0, str(ROOT))

from scripts.bench_common import (
    PINNED_THREADS,
    EchoServer,
    Sample,
    add_run_options,
    check_run_options,
    cpu_seconds,
    fmt_number,
    fmt_ratio,
    machine_facts,
    markdown_table,
    measure,
    ort_baseline,
)

os.environ.update(PINNED_THREADS)  # before numpy and onnxruntime start their thread pools

import grpc
import numpy as np

from scripts.bench_http import (
    REPOSITORY,
    ServerUnderTest,
    Workload,
    encode_request,
    http_problems,
    workloads,
)
from server.generated import grpc_service_pb2 as pb
from server.loadtest import clients as loadtest_clients  # the generator tensorgate-bench uses
from server.loadtest.clients import HttpFraming

MAX_MESSAGE = loadtest_clients.MAX_GRPC_MESSAGE  # INT32_MAX both ways, as Triton's clients set it
_MB = 1e6
_DATATYPE = {np.dtype(np.int32): "INT32", np.dtype(np.float32): "FP32"}
_DTYPE = {name: dtype for dtype, name in _DATATYPE.items()}

# (workload label, concurrency) -> DESIGN.md "Performance targets" (perf_analyzer, 2 cores).
_TARGETS = {
    ("HTTP", "simple", 8): 4000.0,
    ("gRPC", "simple", 8): 3300.0,
    ("HTTP", "identity_fp32", 1): 40.0,
    ("gRPC", "identity_fp32", 1): 35.0,
}


def bench_workloads() -> list[Workload]:
    """The binary workloads of ``bench_http.py``: same inputs, expected outputs, concurrencies."""
    return [w for w in workloads() if w.binary]


# --- gRPC encoding and checks ---------------------------------------------------------------


def encode_grpc_request(workload: Workload) -> bytes:
    """A serialized ``ModelInferRequest`` with ``raw_input_contents``, asking for the outputs the
    HTTP request asks for; made once and sent as-is every time."""
    request = pb.ModelInferRequest(model_name=workload.model)
    for name, array in workload.inputs.items():
        request.inputs.add(name=name, datatype=_DATATYPE[array.dtype], shape=array.shape)
        request.raw_input_contents.append(np.ascontiguousarray(array).tobytes())
    for name in sorted(workload.expected):
        request.outputs.add(name=name)
    return request.SerializeToString()


def check_grpc_response(raw: bytes, workload: Workload) -> list[str]:
    """Problems with one ``ModelInferResponse`` (outputs, shapes, values); empty when correct."""
    try:
        msg = pb.ModelInferResponse.FromString(raw)
    except Exception as exc:  # noqa: BLE001 - any parse failure is the finding
        return [f"unparseable ModelInferResponse ({len(raw)} B): {exc}"]
    problems = []
    if msg.model_name != workload.model:
        problems.append(f"model_name {msg.model_name!r}, expected {workload.model!r}")
    if len(msg.raw_output_contents) != len(msg.outputs):
        problems.append(
            f"{len(msg.raw_output_contents)} raw_output_contents for {len(msg.outputs)} outputs"
        )
    seen = set()
    for index, output in enumerate(msg.outputs):
        seen.add(output.name)
        if output.HasField("contents"):
            problems.append(f"{output.name} came back in typed contents")
        dtype = _DTYPE.get(output.datatype)
        expected = workload.expected.get(output.name)
        if dtype is None or expected is None or index >= len(msg.raw_output_contents):
            problems.append(f"{output.name}: unexpected output or datatype {output.datatype}")
            continue
        data = msg.raw_output_contents[index]
        shape = tuple(output.shape)
        if len(data) != expected.nbytes or shape != expected.shape:
            problems.append(f"{output.name}: {len(data)} B of shape {list(shape)}")
            continue
        value = np.frombuffer(data, dtype.newbyteorder("<")).reshape(shape)
        if output.datatype != _DATATYPE[expected.dtype] or not np.array_equal(value, expected):
            problems.append(f"{output.name} has wrong values")
    if seen != set(workload.expected):
        problems.append(f"outputs {sorted(seen)}, expected {sorted(workload.expected)}")
    return problems


# --- gRPC load generator ----------------------------------------------------------------------


class GrpcLoadGenerator(loadtest_clients.GrpcLoadGenerator):
    """tensorgate-bench's grpc.aio closed loop (``concurrency`` coroutines on ``channels``
    channels, one pre-serialized request), with the server's CPU time over each run."""

    async def run(self, seconds: float, max_requests: int, server_pid: int | None = None) -> Sample:
        """Keep ``concurrency`` calls in flight for ``seconds`` or until ``max_requests`` were
        sent; ``server_pid``'s CPU time over the run is recorded too."""
        server_cpu = None if server_pid is None else cpu_seconds(server_pid)
        sample = await self.run_for(seconds, max_requests, Sample())
        if server_pid is not None and server_cpu is not None:
            sample.server_cpu = cpu_seconds(server_pid) - server_cpu
        return sample


def measure_grpc(
    address: tuple[str, int],
    request: bytes,
    concurrency: int,
    channels: int,
    seconds: float,
    max_requests: int,
    server_pid: int | None,
    before_timed: Callable[[], object] | None = None,
) -> tuple[Sample, str]:
    """As ``bench_common.measure``: one request alone (the one to verify), a short warm-up,
    ``before_timed()`` if given, then the timed run, which carries that first response; also
    the first error seen, if any."""

    async def run() -> tuple[Sample, str]:
        generator = GrpcLoadGenerator(address, request, concurrency, channels)
        try:
            await generator.connect()
            first = await generator.run(seconds, 1)
            warm = await generator.run(min(0.5, seconds / 5), max_requests)
            if before_timed is not None:
                before_timed()
            sample = await generator.run(seconds, max_requests, server_pid)
        finally:
            await generator.close()
        sample.first_response = first.first_response
        return sample, first.first_error or warm.first_error or sample.first_error

    return asyncio.run(run())


def grpc_problems(sample: Sample, first_error: str, workload: Workload) -> list[str]:
    """What is wrong with a gRPC measurement: its first answer, or its failed calls."""
    if not sample.first_response:
        return [f"no response at all ({first_error or 'no error either'})"]
    problems = check_grpc_response(sample.first_response, workload)
    if first_error:
        problems.append(f"{sample.errors} failed calls, first: {first_error}")
    return problems


# --- grpc.aio echo baseline ------------------------------------------------------------------


def _grpc_echo_main(port_pipe: Connection) -> None:
    """A grpc.aio server answering ModelInfer with the request's own bytes, unparsed: what
    Python gRPC costs with no serving (the gRPC counterpart of bench_common's socket echo)."""

    async def echo(request: bytes, context: Any) -> bytes:
        return request

    async def serve() -> None:
        server = grpc.aio.server(
            options=[
                ("grpc.max_send_message_length", MAX_MESSAGE),
                ("grpc.max_receive_message_length", MAX_MESSAGE),
            ]
        )
        handler = grpc.method_handlers_generic_handler(
            "inference.GRPCInferenceService",
            {"ModelInfer": grpc.unary_unary_rpc_method_handler(echo)},
        )
        server.add_generic_rpc_handlers((handler,))
        port_pipe.send(server.add_insecure_port("127.0.0.1:0"))
        await server.start()
        await server.wait_for_termination()  # until the parent terminates this process

    asyncio.run(serve())


# --- the run --------------------------------------------------------------------------------


@dataclass
class Cell:
    """One workload at one concurrency: HTTP binary and gRPC on the same server, and ORT."""

    workload: Workload
    concurrency: int
    http_request_bytes: int
    grpc_request_bytes: int
    http: Sample
    http_problems: list[str]
    grpc: Sample
    grpc_problems: list[str]
    ort: Sample
    echo: Sample | None


@dataclass
class Endpoints:
    """What every cell talks to: the server under test (both ports) and the gRPC echo."""

    http: tuple[str, int]
    grpc: tuple[str, int]
    server_pid: int
    echo: EchoServer | None


def run_cells(endpoints: Endpoints, args: argparse.Namespace) -> list[Cell]:
    ort_samples: dict[str, Sample] = {}
    cells = []
    for workload in bench_workloads():
        if workload.model not in ort_samples:
            model_file = REPOSITORY / workload.model / "1" / "model.onnx"
            sample, outputs = ort_baseline(
                model_file, workload.inputs, args.seconds, args.max_requests
            )
            wrong = [n for n, v in workload.expected.items() if not np.array_equal(outputs[n], v)]
            if wrong:
                raise RuntimeError(f"ONNX Runtime itself answers {workload.model} {wrong} wrong")
            ort_samples[workload.model] = sample
        for concurrency in workload.concurrencies:
            cells.append(
                run_cell(endpoints, workload, concurrency, ort_samples[workload.model], args)
            )
    return cells


def run_cell(
    endpoints: Endpoints,
    workload: Workload,
    concurrency: int,
    ort: Sample,
    args: argparse.Namespace,
) -> Cell:
    """HTTP binary, then gRPC, then the gRPC echo, one after the other at one concurrency."""
    http_request = encode_request(f"{endpoints.http[0]}:{endpoints.http[1]}", workload)
    grpc_request = encode_grpc_request(workload)
    http = measure(
        endpoints.http,
        http_request,
        HttpFraming(),
        concurrency,
        args.seconds,
        args.max_requests,
        len(http_request) + (1 << 16),
        endpoints.server_pid,
    )
    problems_http = http_problems(http, workload)
    grpc_sample, first_error = measure_grpc(
        endpoints.grpc,
        grpc_request,
        concurrency,
        args.grpc_channels,
        args.seconds,
        args.max_requests,
        endpoints.server_pid,
    )
    problems_grpc = grpc_problems(grpc_sample, first_error, workload)
    echo = None
    if endpoints.echo is not None:
        echo, echo_error = measure_grpc(
            endpoints.echo.address,
            grpc_request,
            concurrency,
            args.grpc_channels,
            args.seconds,
            args.max_requests,
            endpoints.echo.pid,
        )
        if echo_error or echo.first_response != grpc_request:
            raise RuntimeError(f"the gRPC echo baseline failed: {echo_error or 'wrong bytes'}")
    return Cell(
        workload,
        concurrency,
        len(http_request),
        len(grpc_request),
        http,
        problems_http,
        grpc_sample,
        problems_grpc,
        ort,
        echo,
    )


# --- report ---------------------------------------------------------------------------------


def _throughput(sample: Sample, workload: Workload) -> str:
    text = f"{fmt_number(sample.rate)}/s"
    if workload.reports_bandwidth:
        text += f" ({fmt_number(sample.rate * workload.payload_bytes / _MB)} MB/s)"
    return text


def _per_request_us(cpu: float | None, sample: Sample) -> str:
    if cpu is None or not sample.requests:
        return "n/a"
    return f"{fmt_number(cpu / sample.requests * 1e6)} µs"


def _target(protocol: str, cell: Cell) -> str:
    target = _TARGETS.get((protocol, cell.workload.model, cell.concurrency))
    return "" if target is None else f"≥ {fmt_number(target)}/s"


def _short_label(workload: Workload) -> str:
    return workload.label.removesuffix(" binary")


def _rows_of(cell: Cell) -> list[tuple[str, Sample, list[str]]]:
    rows = [("HTTP binary", cell.http, cell.http_problems), ("gRPC", cell.grpc, cell.grpc_problems)]
    if cell.echo is not None:
        rows.append(("grpc.aio echo (baseline)", cell.echo, []))
    return rows


def table_rows(cells: list[Cell]) -> list[list[str]]:
    rows = []
    for cell in cells:
        workload = cell.workload
        for index, (protocol, sample, problems) in enumerate(_rows_of(cell)):
            is_grpc = protocol == "gRPC"
            over_http = over_echo = ""
            if is_grpc:
                over_http = fmt_ratio(cell.grpc.rate / cell.http.rate) if cell.http.rate else "n/a"
                if cell.echo is not None:
                    over_echo = fmt_ratio(cell.grpc.rate / cell.echo.rate)
            rows.append(
                [
                    _short_label(workload) if index == 0 else "",
                    str(cell.concurrency) if index == 0 else "",
                    protocol + ("" if not problems else " **WRONG**"),
                    _throughput(sample, workload),
                    fmt_number(sample.percentile_ms(0.5)),
                    fmt_number(sample.percentile_ms(0.99)),
                    over_http,
                    over_echo,
                    fmt_ratio(sample.rate / cell.ort.rate) if index < 2 else "",
                    _target(protocol.split()[0], cell),
                ]
            )
    return rows


def ort_rows(cells: list[Cell]) -> list[str]:
    seen: dict[str, Cell] = {}
    for cell in cells:
        seen.setdefault(cell.workload.model, cell)
    return [
        f"- ORT `run` baseline, {model}: {_throughput(cell.ort, cell.workload)}, "
        f"p50 {fmt_number(cell.ort.percentile_ms(0.5))} ms, "
        f"p99 {fmt_number(cell.ort.percentile_ms(0.99))} ms ({cell.ort.requests:,} calls)"
        for model, cell in seen.items()
    ]


def report(cells: list[Cell], facts: dict[str, str], args: argparse.Namespace) -> str:
    pinning = ", ".join(f"{k}=1" for k in PINNED_THREADS)
    lines = [
        "## tensorgate gRPC benchmark, beside HTTP binary (same server process, same run)",
        "",
        (
            "- server: tensorgate started by this script (`python -m server`, HTTP and gRPC "
            "on 127.0.0.1, free ports)"
        ),
        (
            f"- machine: nproc {facts['nproc']} ({facts['cpu']}), Python {facts['python']}, "
            f"onnxruntime {facts['onnxruntime']}, grpcio {facts['grpcio']}, {facts['platform']}; "
            f"load average {facts['load_average_1min']} at start"
        ),
        (
            f"- thread pinning: {pinning} for the server and this process; server "
            "`--backend-config=onnxruntime,intra_op_thread_count=1`; ORT baseline "
            "`intra_op_num_threads=1`, `inter_op_num_threads=1`"
        ),
        (
            "- HTTP load: bench_http's generator (one thread, non-blocking sockets, keep-alive, "
            "one connection per slot, request pre-encoded). gRPC load: grpc.aio in one thread, "
            "request serialized once and passed through an identity serializer, responses kept "
            f"as bytes, N calls in flight on {args.grpc_channels} channel(s) for concurrency N. "
            f"**Client and server share the same {facts['nproc']} cores**, so every figure "
            "includes the client's CPU cost (see the CPU lines below)."
        ),
        (
            "- baselines: ORT `run` (one in-process caller, the same figure at every "
            "concurrency) and a grpc.aio echo (a child process whose ModelInfer handler returns "
            "the request's bytes unparsed: Python gRPC's own cost for the same bytes, same "
            "concurrency, same client)"
            if args.echo
            else "- baseline: ORT `run` (one in-process caller, the same figure at every "
            "concurrency); grpc.aio echo baseline skipped (--no-echo)"
        ),
        (
            f"- {args.seconds:g} s per cell after a short warm-up (cap {args.max_requests:,} "
            "requests), HTTP, gRPC and echo one after the other for each cell; ratios are of "
            "req/s; MB = 10^6 bytes of tensor payload each way; targets are DESIGN.md's "
            "(perf_analyzer on 2 cores), for orientation only."
        ),
        "",
        markdown_table(
            [
                "workload",
                "concurrency",
                "protocol",
                "req/s",
                "p50 ms",
                "p99 ms",
                "gRPC ÷ HTTP",
                "gRPC ÷ echo",
                "÷ ORT `run`",
                "target",
            ],
            table_rows(cells),
        ),
        "",
        *ort_rows(cells),
        "",
        "Checks and CPU per request (server = tensorgate or the echo, client = this process):",
    ]
    for cell in cells:
        for protocol, sample, problems in _rows_of(cell):
            size = (
                cell.http_request_bytes if protocol.startswith("HTTP") else cell.grpc_request_bytes
            )
            verdict = "first response correct" if not problems else "; ".join(problems)
            lines.append(
                f"- {_short_label(cell.workload)} ×{cell.concurrency} {protocol}: "
                f"{size:,} B → {len(sample.first_response):,} B, {sample.requests:,} requests, "
                f"{sample.errors} errors, {verdict}; server "
                f"{_per_request_us(sample.server_cpu, sample)}, client "
                f"{_per_request_us(sample.client_cpu, sample)}"
            )
    return "\n".join(lines)


def to_json(cells: list[Cell], facts: dict[str, str], args: argparse.Namespace) -> dict[str, Any]:
    return {
        "machine": facts,
        "thread_pinning": PINNED_THREADS,
        "seconds": args.seconds,
        "max_requests": args.max_requests,
        "grpc_channels": args.grpc_channels,
        "cells": [
            {
                "workload": cell.workload.label,
                "concurrency": cell.concurrency,
                "http": {
                    **cell.http.figures(cell.workload.payload_bytes),
                    "request_bytes": cell.http_request_bytes,
                    "response_bytes": len(cell.http.first_response),
                    "problems": cell.http_problems,
                },
                "grpc": {
                    **cell.grpc.figures(cell.workload.payload_bytes),
                    "request_bytes": cell.grpc_request_bytes,
                    "response_bytes": len(cell.grpc.first_response),
                    "problems": cell.grpc_problems,
                },
                "grpc_over_http": cell.grpc.rate / cell.http.rate if cell.http.rate else None,
                "ort": cell.ort.figures(cell.workload.payload_bytes),
                "grpc_echo": None if cell.echo is None else cell.echo.figures(cell.workload.payload_bytes),
            }
            for cell in cells
        ],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser, max_requests=200_000)
    parser.add_argument(
        "--grpc-channels",
        type=int,
        default=1,
        help="gRPC channels (TCP connections) the in-flight calls are spread over",
    )
    parser.add_argument(
        "--no-echo",
        dest="echo",
        action="store_false",
        help="skip the grpc.aio echo baseline (saves one timed run per cell)",
    )
    args = parser.parse_args(argv)
    check_run_options(parser, args)
    if args.grpc_channels < 1:
        parser.error("--grpc-channels must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    facts = {**machine_facts(), "grpcio": grpc.__version__}
    server = ServerUnderTest()
    echo = None
    try:
        echo = EchoServer(_grpc_echo_main, "gRPC echo server") if args.echo else None
        endpoints = Endpoints(server.address, server.grpc_address(), server.proc.pid, echo)
        cells = run_cells(endpoints, args)
    finally:
        if echo is not None:
            echo.stop()
        server.stop()
    print(report(cells, facts, args))
    notable = server.notable_log_lines()
    print(f"\nServer log during the run: {len(notable)} warning/error/stray lines")
    for line in notable[:20]:
        print(f"    {line}")
    if args.json:
        args.json.write_text(json.dumps(to_json(cells, facts, args), indent=2) + "\n")
    failed = any(
        cell.http_problems or cell.grpc_problems or cell.http.errors or cell.grpc.errors
        for cell in cells
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
