"""Benchmark tensorgate's dynamic batcher: the example MLP with batching on and off, in one run.

The MLP (256 -> 256 -> 10, FP32) is served twice by one server from two temporary repositories
holding the same ONNX file: ``mlp_batched`` with ``dynamic_batching { max_queue_delay_microseconds:
N }`` and ``mlp_direct`` without it, both ``max_batch_size: 32`` and ``instance_group [{ count: 2,
kind: KIND_CPU }]``. Batch-1 requests ([1,256] FP32) go to each at concurrency 1, 8, 32 and 64 over
HTTP binary (and gRPC with ``raw_input_contents``), off and on cell after cell, and the table shows
requests/s, p50/p99 latency, the on/off throughput ratio and, from the statistics extension read
before and after each timed batched cell, the histogram of executed batch sizes. Figures are for
people, never a CI gate: on a shared 2-core machine only same-run ratios carry between runs.

    python scripts/bench_batching.py [--seconds 5] [--delay-us 1000] [--no-grpc] [--json PATH]

Target (DESIGN.md "Performance targets", issue 5): at concurrency >= 32, batching on gives >= 3x
the throughput of batching off, with p99 latency no worse. The server is ``python -m server`` on
127.0.0.1 and free ports, BLAS/OpenMP and ONNX Runtime pinned to one thread (as ``bench_http.py``
starts it), stopped by PID (SIGTERM) at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file: make the `scripts` package importable
    sys.path.insert(0, str(ROOT))

from scripts.bench_common import (
    PINNED_THREADS,
    Sample,
    fmt_number,
    fmt_ratio,
    machine_facts,
    markdown_table,
    measure,
    ort_baseline,
)

os.environ.update(PINNED_THREADS)  # before numpy and onnxruntime start their thread pools

import numpy as np

from scripts.bench_grpc import (
    GrpcLoadGenerator,
    check_grpc_response,
    encode_grpc_request,
)
from scripts.bench_http import (
    REPOSITORY,
    HttpFraming,
    ServerUnderTest,
    Workload,
    check_response,
    encode_request,
)

MODEL_FILE = REPOSITORY / "mlp" / "1" / "model.onnx"
BATCHED, DIRECT = "mlp_batched", "mlp_direct"
CONCURRENCIES = (1, 8, 32, 64)
MAX_BATCH_SIZE = 32
INSTANCES = 2
TARGET_RATIO = 3.0  # at concurrency >= TARGET_FROM: on/off throughput, with p99 no worse
TARGET_FROM = 32
GRPC_TARGET = 5200.0  # DESIGN.md: MLP, gRPC, concurrency 32, dynamic batching (perf_analyzer)

_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 256 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 10 ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
{batching}"""


# --- the model repositories and the server --------------------------------------------------


def write_repositories(base: Path, delay_us: int) -> list[Path]:
    """Two repositories under ``base``, one model each: the same ONNX file, batching on / off."""
    repositories = []
    for name, batching in (
        (BATCHED, f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n"),
        (DIRECT, ""),
    ):
        repository = base / f"repo_{name}"
        version = repository / name / "1"
        version.mkdir(parents=True)
        shutil.copyfile(MODEL_FILE, version / "model.onnx")
        (repository / name / "config.pbtxt").write_text(
            _CONFIG.format(
                name=name,
                max_batch_size=MAX_BATCH_SIZE,
                instances=INSTANCES,
                batching=batching,
            )
        )
        repositories.append(repository)
    return repositories


def get_json(address: tuple[str, int], path: str) -> Any:
    connection = http.client.HTTPConnection(*address, timeout=10)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            raise RuntimeError(f"GET {path}: {response.status} {body[:300]!r}")
        return json.loads(body)
    finally:
        connection.close()


@dataclass(frozen=True)
class Counters:
    """What the statistics extension says about one model: executions per batch size."""

    inference_count: int
    execution_count: int
    success_count: int
    executions: dict[int, int]  # batch size -> compute_infer count

    @classmethod
    def read(cls, address: tuple[str, int], model: str) -> Counters:
        document = get_json(address, f"/v2/models/{model}/stats")
        (stats,) = document["model_stats"]
        return cls(
            int(stats["inference_count"]),
            int(stats["execution_count"]),
            int(stats["inference_stats"]["success"]["count"]),
            {
                int(entry["batch_size"]): int(entry["compute_infer"]["count"])
                for entry in stats.get("batch_stats", [])
            },
        )

    def __sub__(self, before: Counters) -> Counters:
        sizes = set(self.executions) | set(before.executions)
        delta = {s: self.executions.get(s, 0) - before.executions.get(s, 0) for s in sizes}
        return Counters(
            self.inference_count - before.inference_count,
            self.execution_count - before.execution_count,
            self.success_count - before.success_count,
            {s: n for s, n in sorted(delta.items()) if n},
        )

    @property
    def rows(self) -> int:
        return sum(size * count for size, count in self.executions.items())

    @property
    def mean_batch(self) -> float:
        executions = sum(self.executions.values())
        return self.rows / executions if executions else float("nan")

    def summary(self, top: int = 3) -> str:
        """Mean rows per execution and the most frequent batch sizes, for a table cell."""
        total = sum(self.executions.values())
        if not total:
            return "no executions"
        common = sorted(self.executions.items(), key=lambda item: (-item[1], -item[0]))[:top]
        text = ", ".join(f"{size}: {100 * count / total:.0f}%" for size, count in common)
        if len(self.executions) > top:
            text += f" (+{len(self.executions) - top} sizes)"
        return f"mean {self.mean_batch:.1f}; {text}"

    def full(self) -> str:
        return " ".join(f"{size}×{count:,}" for size, count in self.executions.items())


# --- load -----------------------------------------------------------------------------------


async def _measure_grpc(
    address: tuple[str, int],
    request: bytes,
    concurrency: int,
    seconds: float,
    max_requests: int,
    server_pid: int,
    before_timed: Callable[[], object],
) -> tuple[Sample, str]:
    """``bench_grpc.measure_grpc`` (one channel) with the ``before_timed`` hook of
    ``bench_common.measure``: first call alone, warm-up, hook, timed run."""
    generator = GrpcLoadGenerator(address, request, concurrency, 1)
    try:
        await generator.connect()
        first = await generator.run(seconds, 1)
        await generator.run(min(0.5, seconds / 5), max_requests)
        before_timed()
        sample = await generator.run(seconds, max_requests, server_pid)
    finally:
        await generator.close()
    sample.first_response = first.first_response
    return sample, generator.first_error


@dataclass
class Run:
    """One model at one concurrency over one protocol."""

    sample: Sample
    problems: list[str]
    counters: Counters


@dataclass
class Cell:
    protocol: str
    concurrency: int
    off: Run
    on: Run

    @property
    def ratio(self) -> float:
        return self.on.sample.rate / self.off.sample.rate if self.off.sample.rate else 0.0

    @property
    def meets_target(self) -> bool:
        return self.ratio >= TARGET_RATIO and self.on.sample.percentile_ms(
            0.99
        ) <= self.off.sample.percentile_ms(0.99)


@dataclass
class Endpoints:
    http: tuple[str, int]
    grpc: tuple[str, int] | None
    server_pid: int


def run_one(
    endpoints: Endpoints,
    protocol: str,
    workload: Workload,
    concurrency: int,
    args: argparse.Namespace,
) -> Run:
    marks: dict[str, Counters] = {}

    def before_timed() -> None:
        marks["before"] = Counters.read(endpoints.http, workload.model)

    if protocol == "HTTP":
        request = encode_request(f"{endpoints.http[0]}:{endpoints.http[1]}", workload)
        sample = measure(
            endpoints.http,
            request,
            HttpFraming(),
            concurrency,
            args.seconds,
            args.max_requests,
            len(request) + (1 << 16),
            endpoints.server_pid,
            before_timed,
        )
        problems = (
            check_response(sample.first_response, workload)
            if sample.first_response
            else ["no response at all"]
        )
    else:
        assert endpoints.grpc is not None
        sample, first_error = asyncio.run(
            _measure_grpc(
                endpoints.grpc,
                encode_grpc_request(workload),
                concurrency,
                args.seconds,
                args.max_requests,
                endpoints.server_pid,
                before_timed,
            )
        )
        problems = (
            check_grpc_response(sample.first_response, workload)
            if sample.first_response
            else [f"no response at all ({first_error or 'no error either'})"]
        )
        if first_error and sample.first_response:
            problems.append(f"{sample.errors} failed calls, first: {first_error}")
    counters = Counters.read(endpoints.http, workload.model) - marks["before"]
    # The server's own count of the timed run must match the client's.
    if (
        counters.success_count != sample.requests - sample.errors
        or counters.rows != counters.inference_count
    ):
        problems.append(
            f"statistics disagree: client {sample.requests:,} answered ({sample.errors} errors), "
            f"server {counters.success_count:,} successes, {counters.inference_count:,} "
            f"inferences, {counters.rows:,} rows in batch_stats"
        )
    if workload.model == DIRECT and set(counters.executions) - {1}:
        problems.append(f"batching off executed batches {counters.full()}")
    return Run(sample, problems, counters)


def run_cells(endpoints: Endpoints, args: argparse.Namespace) -> tuple[list[Cell], dict[str, Any]]:
    inputs = {"INPUT0": np.random.default_rng(5).standard_normal((1, 256), dtype=np.float32)}
    ort1, outputs = ort_baseline(MODEL_FILE, inputs, args.seconds, args.max_requests)
    batch = {"INPUT0": np.random.default_rng(6).standard_normal((MAX_BATCH_SIZE, 256), np.float32)}
    ort32, _ = ort_baseline(MODEL_FILE, batch, args.seconds, args.max_requests)
    expected = {"OUTPUT0": outputs["OUTPUT0"]}
    if expected["OUTPUT0"].shape != (1, 10) or not np.isfinite(expected["OUTPUT0"]).all():
        raise RuntimeError(f"ONNX Runtime's own answer looks wrong: {expected['OUTPUT0']!r}")
    workloads = {
        model: Workload(model, model, True, CONCURRENCIES, inputs, expected, False)
        for model in (DIRECT, BATCHED)
    }
    protocols = ["HTTP"] + (["gRPC"] if endpoints.grpc is not None else [])
    cells = []
    for protocol in protocols:
        for concurrency in CONCURRENCIES:
            off = run_one(endpoints, protocol, workloads[DIRECT], concurrency, args)
            on = run_one(endpoints, protocol, workloads[BATCHED], concurrency, args)
            cells.append(Cell(protocol, concurrency, off, on))
    return cells, {"batch_1": ort1, f"batch_{MAX_BATCH_SIZE}": ort32}


# --- report ---------------------------------------------------------------------------------


def _cpu_us(run: Run) -> str:
    sample = run.sample
    if sample.server_cpu is None or not sample.requests:
        return "n/a"
    return f"{fmt_number(sample.server_cpu / sample.requests * 1e6)} µs"


def table_rows(cells: list[Cell]) -> list[list[str]]:
    rows = []
    for cell in cells:
        wrong = " **WRONG**" if cell.off.problems or cell.on.problems else ""
        marker = ""
        if cell.concurrency >= TARGET_FROM:
            marker = " ✅" if cell.meets_target else " ❌"
        rows.append(
            [
                cell.protocol + wrong,
                str(cell.concurrency),
                f"{fmt_number(cell.off.sample.rate)}/s",
                fmt_number(cell.off.sample.percentile_ms(0.5)),
                fmt_number(cell.off.sample.percentile_ms(0.99)),
                f"{fmt_number(cell.on.sample.rate)}/s",
                fmt_number(cell.on.sample.percentile_ms(0.5)),
                fmt_number(cell.on.sample.percentile_ms(0.99)),
                fmt_ratio(cell.ratio) + marker,
                cell.on.counters.summary(),
            ]
        )
    return rows


def verdict(cells: list[Cell]) -> list[str]:
    lines = []
    for protocol in dict.fromkeys(cell.protocol for cell in cells):
        judged = [c for c in cells if c.protocol == protocol and c.concurrency >= TARGET_FROM]
        if not judged:
            continue
        met = all(c.meets_target for c in judged)
        details = "; ".join(
            f"×{c.concurrency}: {fmt_ratio(c.ratio)}, p99 {fmt_number(c.on.sample.percentile_ms(0.99))}"
            f" vs {fmt_number(c.off.sample.percentile_ms(0.99))} ms"
            for c in judged
        )
        lines.append(f"- {protocol}: target **{'met' if met else 'NOT met'}** ({details})")
    grpc32 = [c for c in cells if c.protocol == "gRPC" and c.concurrency == 32]
    if grpc32:
        rate = grpc32[0].on.sample.rate
        lines.append(
            f"- DESIGN.md also asks ≥ {GRPC_TARGET:,.0f} infer/s for this model over gRPC at "
            f"concurrency 32 with batching (perf_analyzer as client): {fmt_number(rate)}/s here, "
            f"**{'met' if rate >= GRPC_TARGET else 'NOT met'}** (a Python client shares the cores)"
        )
    return lines


def report(
    cells: list[Cell], ort: dict[str, Sample], facts: dict[str, str], args: argparse.Namespace
) -> str:
    pinning = ", ".join(f"{k}=1" for k in PINNED_THREADS)
    ort1, ort32 = ort["batch_1"], ort[f"batch_{MAX_BATCH_SIZE}"]
    lines = [
        "## tensorgate dynamic batching benchmark (MLP 256→256→10 FP32, batch-1 requests)",
        "",
        (
            f"- models: `{DIRECT}` (no `dynamic_batching`) and `{BATCHED}` (`dynamic_batching "
            f"{{ max_queue_delay_microseconds: {args.delay_us} }}`, default preferred size "
            f"[{MAX_BATCH_SIZE}]), both `max_batch_size: {MAX_BATCH_SIZE}`, `instance_group "
            f"[{{ count: {INSTANCES} kind: KIND_CPU }}]`, same ONNX file, one server"
        ),
        (
            f"- machine: nproc {facts['nproc']} ({facts['cpu']}), Python {facts['python']}, "
            f"onnxruntime {facts['onnxruntime']}, grpcio {facts['grpcio']}, {facts['platform']};"
            f" load average {facts['load_average_1min']} at start"
        ),
        (
            f"- thread pinning: {pinning} for the server and this process; server "
            "`--backend-config=onnxruntime,intra_op_thread_count=1`"
        ),
        (
            "- load: closed loop, requests pre-encoded, [1,256] FP32; HTTP binary over keep-alive "
            "HTTP/1.1, one connection per concurrency slot, one Python thread; gRPC "
            "`raw_input_contents`, one channel, one coroutine per slot. **Client and server "
            f"share the same {facts['nproc']} cores**: every figure includes the client's CPU cost."
        ),
        (
            f"- {args.seconds:g} s per cell after a short warm-up (cap {args.max_requests:,} "
            "requests); off and on run one after the other at each concurrency; the histogram "
            "is the delta of `batch_stats` (compute_infer count per batch size) over the timed "
            "batched run, from `GET /v2/models/mlp_batched/stats`"
        ),
        (
            f"- same-run ceiling, ONNX Runtime `run` in-process, 1 thread: batch 1 "
            f"{fmt_number(ort1.rate)} runs/s (p50 {fmt_number(ort1.percentile_ms(0.5) * 1e3)} µs); "
            f"batch {MAX_BATCH_SIZE} {fmt_number(ort32.rate)} runs/s = "
            f"{fmt_number(ort32.rate * MAX_BATCH_SIZE)} rows/s "
            f"(p50 {fmt_number(ort32.percentile_ms(0.5) * 1e3)} µs)"
        ),
        "",
        markdown_table(
            [
                "protocol",
                "concurrency",
                "off req/s",
                "off p50 ms",
                "off p99 ms",
                "on req/s",
                "on p50 ms",
                "on p99 ms",
                "on/off",
                "batch sizes (on)",
            ],
            table_rows(cells),
        ),
        "",
        (
            f"Target (DESIGN.md, issue 5): at concurrency ≥ {TARGET_FROM}, batching on ≥ "
            f"{TARGET_RATIO:g}× the throughput of batching off, with p99 no worse. In this run:"
        ),
        *verdict(cells),
        "",
        (
            "Checks, CPU per request (server; client = this process) and full batch-size "
            "histograms (size×executions):"
        ),
    ]
    for cell in cells:
        for label, run in (("off", cell.off), ("on", cell.on)):
            sample = run.sample
            check = (
                "first response = direct ONNX Runtime"
                if not run.problems
                else "; ".join(run.problems)
            )
            lines.append(
                f"- {cell.protocol} ×{cell.concurrency} {label}: {sample.requests:,} requests, "
                f"{sample.errors} errors, {check}; CPU/req server {_cpu_us(run)}, client "
                f"{fmt_number(sample.client_cpu / max(sample.requests, 1) * 1e6)} µs; "
                f"{run.counters.execution_count:,} executions: {run.counters.full()}"
            )
    return "\n".join(lines)


def _run_json(run: Run) -> dict[str, Any]:
    return {
        **run.sample.figures(256 * 4),
        "problems": run.problems,
        "execution_count": run.counters.execution_count,
        "batch_sizes": {str(size): count for size, count in run.counters.executions.items()},
    }


def to_json(
    cells: list[Cell], ort: dict[str, Sample], facts: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    return {
        "machine": facts,
        "thread_pinning": PINNED_THREADS,
        "seconds": args.seconds,
        "max_requests": args.max_requests,
        "max_queue_delay_microseconds": args.delay_us,
        "ort": {name: sample.figures(256 * 4) for name, sample in ort.items()},
        "cells": [
            {
                "protocol": cell.protocol,
                "concurrency": cell.concurrency,
                "ratio": cell.ratio,
                "meets_target": cell.meets_target if cell.concurrency >= TARGET_FROM else None,
                "off": _run_json(cell.off),
                "on": _run_json(cell.on),
            }
            for cell in cells
        ],
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="timed seconds per cell")
    parser.add_argument(
        "--max-requests", type=int, default=500_000, help="request cap per cell (and ORT calls)"
    )
    parser.add_argument(
        "--delay-us",
        type=int,
        default=1000,
        help="max_queue_delay_microseconds of the batched model (default 1000)",
    )
    parser.add_argument("--no-grpc", dest="grpc", action="store_false", help="HTTP only")
    parser.add_argument("--json", type=Path, help="also write the results to this file")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.max_requests <= 0 or args.delay_us < 0:
        parser.error("--seconds and --max-requests must be positive, --delay-us not negative")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import grpc

    facts = {**machine_facts(), "grpcio": grpc.__version__}
    print(f"max_queue_delay_microseconds of {BATCHED}: {args.delay_us}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench_batching_") as base:
        server = ServerUnderTest(repositories=write_repositories(Path(base), args.delay_us))
        try:
            endpoints = Endpoints(
                server.address, server.grpc_address() if args.grpc else None, server.proc.pid
            )
            cells, ort = run_cells(endpoints, args)
        finally:
            server.stop()
    print(report(cells, ort, facts, args))
    notable = server.notable_log_lines()
    print(f"\nServer log during the run: {len(notable)} warning/error/stray lines")
    for line in notable[:20]:
        print(f"    {line}")
    if args.json:
        args.json.write_text(json.dumps(to_json(cells, ort, facts, args), indent=2) + "\n")
    failed = any(run.problems or run.sample.errors for cell in cells for run in (cell.off, cell.on))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
