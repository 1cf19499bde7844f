"""Benchmark tensorgate's dynamic batcher: MLPs with batching on and off, in one run.

Two models, each served twice by one server from temporary repositories holding the same ONNX
file: ``<key>_batched`` with ``dynamic_batching { max_queue_delay_microseconds: N }`` and
``<key>_direct`` without it, both ``max_batch_size: 32`` and ``instance_group [{ count: 2, kind:
KIND_CPU }]``:

- ``mlp``, the example MLP (256 -> 256 -> 10, FP32): ONNX Runtime runs it in about 15 µs, so a
  request's cost is nearly all serving (parsing, scheduling, answering), which batching cannot
  share out;
- ``wide``, a compute-bearing MLP (4096 -> 4096 -> 10, FP32, 67 MB of weights, generated into
  the temporary repository): about 3 ms for one row and 11 ms for 32 rows on one core, the kind
  of model dynamic batching exists for.

The batched models wait up to 1 ms (``mlp``) and 5 ms (``wide``, about a third of a full
batch's compute) for a batch to fill; ``--delay-us`` sets one delay for both.

Batch-1 requests go to each at concurrency 1, 8, 32 and 64 over HTTP binary (and gRPC with
``raw_input_contents``), off and on cell after cell, and the tables show requests/s, p50/p99
latency, the on/off throughput ratio and, from the statistics extension read before and after
each timed batched cell, the histogram of executed batch sizes. Figures are for people, never a
CI gate: on a shared 2-core machine only same-run ratios carry between runs.

    python scripts/bench_batching.py [--models mlp,wide] [--seconds 5] [--delay-us N]
                                     [--no-grpc] [--json PATH]

Target (DESIGN.md "Performance targets", issue 5): at concurrency >= 32, batching on gives >= 3x
the throughput of batching off, with p99 latency no worse. The server is ``python -m server`` on
127.0.0.1 and free ports, BLAS/OpenMP and ONNX Runtime pinned to one thread (as ``bench_http.py``
starts it), stopped by PID (SIGTERM) at the end.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file: make the `scripts` package importable
    sys.path.insert(0, str(ROOT))

from scripts.bench_common import (
    PINNED_THREADS,
    Sample,
    add_run_options,
    check_run_options,
    fmt_number,
    fmt_ratio,
    machine_facts,
    markdown_table,
    measure,
    ort_baseline,
)

os.environ.update(PINNED_THREADS)  # before numpy and onnxruntime start their thread pools

import numpy as np

from scripts.bench_grpc import encode_grpc_request, grpc_problems, measure_grpc
from scripts.bench_http import (
    REPOSITORY,
    ServerUnderTest,
    Workload,
    encode_request,
    http_problems,
)
from server.loadtest.clients import HttpFraming

CONCURRENCIES = (1, 8, 32, 64)
MAX_BATCH_SIZE = 32
INSTANCES = 2
TARGET_RATIO = 3.0  # at concurrency >= TARGET_FROM: on/off throughput, with p99 no worse
TARGET_FROM = 32
GRPC_TARGET = 5200.0  # DESIGN.md: MLP, gRPC, concurrency 32, dynamic batching (perf_analyzer)


@dataclass(frozen=True)
class BenchModel:
    """One MLP of the benchmark, served as ``<key>_direct`` and ``<key>_batched``."""

    key: str
    title: str
    inputs: int
    hidden: int
    outputs: int
    delay_us: int  # max_queue_delay_microseconds of the batched model, unless --delay-us

    @property
    def batched(self) -> str:
        return f"{self.key}_batched"

    @property
    def direct(self) -> str:
        return f"{self.key}_direct"

    @property
    def shape(self) -> str:
        return f"{self.inputs}→{self.hidden}→{self.outputs}"

    def write_file(self, path: Path) -> Path:
        """The ONNX file: the example repository's for ``mlp``, generated for the others."""
        path.parent.mkdir(parents=True, exist_ok=True)
        if self.key == "mlp":
            shutil.copyfile(REPOSITORY / "mlp" / "1" / "model.onnx", path)
        else:
            from scripts import make_models

            make_models.save(make_models.mlp(self.inputs, self.hidden, self.outputs), path)
        return path


MODELS = {
    "mlp": BenchModel("mlp", "the example MLP", 256, 256, 10, 1000),
    # About a third of a full batch's compute (~15 ms for 32 rows on one core): long enough
    # for a batch to fill between executions, short next to what a request waits without it.
    "wide": BenchModel("wide", "a compute-bearing MLP", 4096, 4096, 10, 5000),
}

_CONFIG = """\
name: "{name}"
platform: "onnxruntime_onnx"
max_batch_size: {max_batch_size}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ {inputs} ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ {outputs} ] }} ]
instance_group [ {{ count: {instances} kind: KIND_CPU }} ]
{batching}"""


# --- the model repositories and the server --------------------------------------------------


def write_repositories(
    base: Path, model: BenchModel, delay_us: int
) -> tuple[list[Path], Path]:
    """Two repositories under ``base`` for ``model``, one model each: the same ONNX file,
    batching on / off; and the file itself."""
    model_file = model.write_file(base / f"{model.key}.onnx")
    repositories = []
    for name, batching in (
        (model.batched, f"dynamic_batching {{ max_queue_delay_microseconds: {delay_us} }}\n"),
        (model.direct, ""),
    ):
        repository = base / f"repo_{name}"
        version = repository / name / "1"
        version.mkdir(parents=True)
        (version / "model.onnx").symlink_to(model_file)
        (repository / name / "config.pbtxt").write_text(
            _CONFIG.format(
                name=name,
                max_batch_size=MAX_BATCH_SIZE,
                inputs=model.inputs,
                outputs=model.outputs,
                instances=INSTANCES,
                batching=batching,
            )
        )
        repositories.append(repository)
    return repositories, model_file


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
        problems = http_problems(sample, workload)
    else:
        assert endpoints.grpc is not None
        sample, first_error = measure_grpc(
            endpoints.grpc,
            encode_grpc_request(workload),
            concurrency,
            1,
            args.seconds,
            args.max_requests,
            endpoints.server_pid,
            before_timed,
        )
        problems = grpc_problems(sample, first_error, workload)
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
    if workload.model.endswith("_direct") and set(counters.executions) - {1}:
        problems.append(f"batching off executed batches {counters.full()}")
    return Run(sample, problems, counters)


@dataclass
class ModelResult:
    """Every cell of one model, and ONNX Runtime's own speed on it in this process."""

    model: BenchModel
    cells: list[Cell]
    ort: dict[str, Sample]


def run_cells(
    endpoints: Endpoints, model: BenchModel, model_file: Path, args: argparse.Namespace
) -> ModelResult:
    rng = np.random.default_rng(5)
    inputs = {"INPUT0": rng.standard_normal((1, model.inputs), dtype=np.float32)}
    ort1, outputs = ort_baseline(model_file, inputs, args.seconds, args.max_requests)
    batch = {"INPUT0": rng.standard_normal((MAX_BATCH_SIZE, model.inputs), dtype=np.float32)}
    ort32, _ = ort_baseline(model_file, batch, args.seconds, args.max_requests)
    expected = {"OUTPUT0": outputs["OUTPUT0"]}
    answer = expected["OUTPUT0"]
    if answer.shape != (1, model.outputs) or not np.isfinite(answer).all():
        raise RuntimeError(f"ONNX Runtime's own answer looks wrong: {answer!r}")
    workloads = {
        name: Workload(name, name, True, CONCURRENCIES, inputs, expected, False)
        for name in (model.direct, model.batched)
    }
    protocols = ["HTTP"] + (["gRPC"] if endpoints.grpc is not None else [])
    cells = []
    for protocol in protocols:
        for concurrency in CONCURRENCIES:
            off = run_one(endpoints, protocol, workloads[model.direct], concurrency, args)
            on = run_one(endpoints, protocol, workloads[model.batched], concurrency, args)
            cells.append(Cell(protocol, concurrency, off, on))
    return ModelResult(model, cells, {"batch_1": ort1, f"batch_{MAX_BATCH_SIZE}": ort32})


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


def verdict(result: ModelResult) -> list[str]:
    cells = result.cells
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
    if grpc32 and result.model.key == "mlp":
        rate = grpc32[0].on.sample.rate
        lines.append(
            f"- DESIGN.md also asks ≥ {GRPC_TARGET:,.0f} infer/s for this model over gRPC at "
            f"concurrency 32 with batching (perf_analyzer as client): {fmt_number(rate)}/s here, "
            f"**{'met' if rate >= GRPC_TARGET else 'NOT met'}** (a Python client shares the cores)"
        )
    return lines


def model_section(result: ModelResult, args: argparse.Namespace) -> list[str]:
    model = result.model
    ort1, ort32 = result.ort["batch_1"], result.ort[f"batch_{MAX_BATCH_SIZE}"]
    lines = [
        f"### {model.title}: MLP {model.shape} FP32, [1,{model.inputs}] requests",
        "",
        (
            f"- `{model.direct}` (no `dynamic_batching`) and `{model.batched}` (`dynamic_batching "
            f"{{ max_queue_delay_microseconds: {delay_us(model, args)} }}`, default preferred size "
            f"[{MAX_BATCH_SIZE}]); histogram from `GET /v2/models/{model.batched}/stats`"
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
            table_rows(result.cells),
        ),
        "",
        (
            f"Target (DESIGN.md, issue 5): at concurrency ≥ {TARGET_FROM}, batching on ≥ "
            f"{TARGET_RATIO:g}× the throughput of batching off, with p99 no worse. In this run:"
        ),
        *verdict(result),
        "",
        (
            "Checks, CPU per request (server; client = this process) and full batch-size "
            "histograms (size×executions):"
        ),
    ]
    for cell in result.cells:
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
    return lines


def report(results: list[ModelResult], facts: dict[str, str], args: argparse.Namespace) -> str:
    pinning = ", ".join(f"{k}=1" for k in PINNED_THREADS)
    lines = [
        "## tensorgate dynamic batching benchmark (batch-1 requests, batching on vs off)",
        "",
        (
            f"- each model served as two models by one server: the same ONNX file, both "
            f"`max_batch_size: {MAX_BATCH_SIZE}`, `instance_group [{{ count: {INSTANCES} kind: "
            "KIND_CPU }]`, one with `dynamic_batching` and one without"
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
            "- load: closed loop, requests pre-encoded; HTTP binary over keep-alive HTTP/1.1, one "
            "connection per concurrency slot, one Python thread; gRPC `raw_input_contents`, one "
            "channel, one coroutine per slot. **Client and server share the same "
            f"{facts['nproc']} cores**: every figure includes the client's CPU cost."
        ),
        (
            f"- {args.seconds:g} s per cell after a short warm-up (cap {args.max_requests:,} "
            "requests); off and on run one after the other at each concurrency; the histogram "
            "is the delta of `batch_stats` (compute_infer count per batch size) over the timed "
            "batched run"
        ),
    ]
    for result in results:
        lines += ["", *model_section(result, args)]
    return "\n".join(lines)


def _run_json(run: Run, payload: int) -> dict[str, Any]:
    return {
        **run.sample.figures(payload),
        "problems": run.problems,
        "execution_count": run.counters.execution_count,
        "batch_sizes": {str(size): count for size, count in run.counters.executions.items()},
    }


def to_json(
    results: list[ModelResult], facts: dict[str, str], args: argparse.Namespace
) -> dict[str, Any]:
    models = {}
    for result in results:
        payload = result.model.inputs * 4
        models[result.model.key] = {
            "shape": result.model.shape,
            "max_queue_delay_microseconds": delay_us(result.model, args),
            "ort": {name: sample.figures(payload) for name, sample in result.ort.items()},
            "cells": [
                {
                    "protocol": cell.protocol,
                    "concurrency": cell.concurrency,
                    "ratio": cell.ratio,
                    "meets_target": cell.meets_target if cell.concurrency >= TARGET_FROM else None,
                    "off": _run_json(cell.off, payload),
                    "on": _run_json(cell.on, payload),
                }
                for cell in result.cells
            ],
        }
    return {
        "machine": facts,
        "thread_pinning": PINNED_THREADS,
        "seconds": args.seconds,
        "max_requests": args.max_requests,
        "models": models,
    }


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_run_options(parser, max_requests=500_000)
    parser.add_argument(
        "--delay-us",
        type=int,
        help="max_queue_delay_microseconds of every batched model (default: per model)",
    )
    parser.add_argument("--no-grpc", dest="grpc", action="store_false", help="HTTP only")
    parser.add_argument(
        "--models",
        type=lambda text: [key.strip() for key in text.split(",") if key.strip()],
        default=list(MODELS),
        help=f"comma-separated, from {', '.join(MODELS)} (default: all)",
    )
    args = parser.parse_args(argv)
    check_run_options(parser, args)
    unknown = [key for key in args.models if key not in MODELS]
    if unknown or not args.models:
        parser.error(f"--models: unknown {unknown}, choose from {', '.join(MODELS)}")
    if (args.delay_us or 0) < 0:
        parser.error("--delay-us must not be negative")
    return args


def delay_us(model: BenchModel, args: argparse.Namespace) -> int:
    return model.delay_us if args.delay_us is None else int(args.delay_us)


def bench_model(
    model: BenchModel, args: argparse.Namespace, base: Path
) -> tuple[ModelResult, list[str]]:
    """Serve ``model`` with batching on and off from one fresh server and measure every cell;
    the result and what the server logged that deserves a look."""
    repositories, model_file = write_repositories(base, model, delay_us(model, args))
    server = ServerUnderTest(repositories=repositories)
    try:
        endpoints = Endpoints(
            server.address, server.grpc_address() if args.grpc else None, server.proc.pid
        )
        result = run_cells(endpoints, model, model_file, args)
    finally:
        server.stop()
    return result, server.notable_log_lines()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import grpc

    facts = {**machine_facts(), "grpcio": grpc.__version__}
    results = []
    notable: list[str] = []
    with tempfile.TemporaryDirectory(prefix="bench_batching_") as base:
        for key in args.models:
            print(f"measuring {key}, delay {delay_us(MODELS[key], args)} µs ...", flush=True)
            result, lines = bench_model(MODELS[key], args, Path(base))
            results.append(result)
            notable += lines
    print(report(results, facts, args))
    print(f"\nServer logs during the run: {len(notable)} warning/error/stray lines")
    for line in notable[:20]:
        print(f"    {line}")
    if args.json:
        args.json.write_text(json.dumps(to_json(results, facts, args), indent=2) + "\n")
    failed = any(
        run.problems or run.sample.errors
        for result in results
        for cell in result.cells
        for run in (cell.off, cell.on)
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
