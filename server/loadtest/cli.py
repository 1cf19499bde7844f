"""``tensorgate-bench``: the command line, with tritonclient's and perf_analyzer's flag names.

Errors a user can act on (server unreachable, unknown model, a request the server refuses, bad
flags) end the run with one line on stderr and exit status 1 (2 for flags), never a traceback.
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from server.loadtest import cache_mix
from server.loadtest.encoding import (
    check_grpc_response,
    check_http_response,
    grpc_infer_request,
    http_infer_request,
)
from server.loadtest.errors import BenchError, UsageError
from server.loadtest.inputs import (
    ModelInfo,
    RequestInputs,
    Tensor,
    generate_inputs,
    inputs_from_data,
    parse_shape_option,
    read_data_file,
)
from server.loadtest.measurements import CLIENT_BUSY_LIMIT, StepResult
from server.loadtest.progress import SweepProgress
from server.loadtest.report import table, warnings, write_csv, write_plot
from server.loadtest.server_api import GrpcServerApi, HttpServerApi, ServerApi
from server.loadtest.sweep import Sweep, SweepPlan
from server.loadtest.workers import LoadTarget, WorkerPool

_DEFAULT_PORTS = {"http": 8000, "grpc": 8001}
_DEFAULT_CONCURRENCY = (1, 2, 4, 8)

_DESCRIPTION = """\
Measure a model on a KServe V2 / Triton server at a sweep of concurrencies: each of N
concurrency slots keeps exactly one request in flight (closed loop), with inputs made from the
model's metadata (or read from a file). For each concurrency it reports client-side throughput
and latency percentiles and, from the server's statistics extension, where the server spent
the time (queue, compute input/infer/output, average executed batch).
"""

_EPILOG = f"""\
columns:
  infer/s, rows/s       successful requests (and rows, when --batch-size > 1) per second
  avg/p50/.../p99 ms    client-side latency of the successful requests (nearest rank)
  queue, input, infer,  the server's average per request over the step, from the delta of
  output µs             /v2/models/MODEL/stats (ModelStatistics over gRPC) before and after
  batch                 rows per model execution on the server (dynamic batching at work)
  client CPU %          CPU of each client process over the step, in % of one core

is the client the bottleneck?
  The load runs in --workers client processes, each an asyncio loop sending pre-encoded
  requests, and each measures its own CPU time over every step. A process busier than
  {CLIENT_BUSY_LIMIT:.0%} of a core may have kept the server waiting: the step is marked * in
  the table and warned about. Without --workers the tool starts with one process and, at such
  a step, adds one and measures the step again (up to one per core). Client and server on one
  machine share its cores: for the server's own limits, run the client elsewhere.

examples:
  tensorgate-bench -m simple --concurrency-range 1:8:1 --csv simple.csv --plot simple.png
  tensorgate-bench -m mlp -i grpc -b 8 --concurrency 1,4,16 --measurement-seconds 10
  tensorgate-bench -m identity_fp32 --shape INPUT0:1024 --input-data zero
"""


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not positive")
    return value


def _seconds(minimum_exclusive: bool) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not math.isfinite(value) or value < 0 or (minimum_exclusive and value == 0):
            raise argparse.ArgumentTypeError(
                f"{text} must be {'positive' if minimum_exclusive else 'zero or more'}"
            )
        return value

    return parse


def parse_concurrency_range(text: str) -> tuple[int, ...]:
    """perf_analyzer's ``start:end[:step]`` (additive step, default 1; ``start`` alone is one
    step)."""
    parts = text.split(":")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        numbers = []
    if not 1 <= len(numbers) <= 3 or min(numbers, default=0) < 1:
        raise argparse.ArgumentTypeError(
            f"invalid --concurrency-range {text!r}: expected start[:end[:step]], positive integers"
        )
    start = numbers[0]
    end = numbers[1] if len(numbers) > 1 else start
    step = numbers[2] if len(numbers) > 2 else 1
    if end < start:
        raise argparse.ArgumentTypeError(f"invalid --concurrency-range {text!r}: end < start")
    return tuple(range(start, end + 1, step))


def parse_concurrency_list(text: str) -> tuple[int, ...]:
    """``1,2,4,8``: the concurrencies to measure, in order."""
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"invalid --concurrency {text!r}: expected positive integers separated by commas"
        )
    return values


def parse_url(text: str, protocol: str) -> tuple[str, int]:
    """``host:port`` (a scheme is tolerated, ``[v6]:port`` too); the protocol's default port
    when none is given."""
    rest = text.split("://", 1)[-1].rstrip("/")
    if rest.startswith("["):
        host, _, tail = rest[1:].partition("]")
        port_text = tail.removeprefix(":")
    elif rest.count(":") == 1:
        host, _, port_text = rest.partition(":")
    else:
        host, port_text = rest, ""
    try:
        port = int(port_text) if port_text else _DEFAULT_PORTS[protocol]
    except ValueError:
        port = -1
    if not host or not 0 < port < 65536:
        raise UsageError(f"invalid --url {text!r}: expected host:port")
    return host, port


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tensorgate-bench",
        description=_DESCRIPTION,
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    target = parser.add_argument_group("target")
    target.add_argument("-m", "--model", required=True, metavar="NAME", help="model name")
    target.add_argument(
        "-x",
        "--model-version",
        default="",
        metavar="VERSION",
        help="model version (default: the server's choice)",
    )
    target.add_argument(
        "-u",
        "--url",
        metavar="HOST:PORT",
        help="host:port (default: 127.0.0.1:8000 for http, 127.0.0.1:8001 for grpc)",
    )
    target.add_argument(
        "-i",
        "--protocol",
        type=str.lower,
        choices=("http", "grpc"),
        default="http",
        help="protocol (default: http)",
    )
    encoding = target.add_mutually_exclusive_group()
    encoding.add_argument(
        "--binary",
        dest="binary",
        action="store_true",
        default=True,
        help="HTTP: tensors in the binary data extension (the default)",
    )
    encoding.add_argument(
        "--json", dest="binary", action="store_false", help="HTTP: tensors as JSON"
    )

    load = parser.add_argument_group("load")
    sweep = load.add_mutually_exclusive_group()
    sweep.add_argument(
        "--concurrency-range",
        type=parse_concurrency_range,
        metavar="START:END[:STEP]",
        help="concurrencies START, START+STEP, ... up to END (default: 1,2,4,8)",
    )
    sweep.add_argument(
        "--concurrency",
        type=parse_concurrency_list,
        metavar="N,N,...",
        help="these concurrencies, in this order",
    )
    load.add_argument(
        "-b",
        "--batch-size",
        type=_positive_int,
        metavar="ROWS",
        help="rows per request, for models with max_batch_size > 0 (default: 1, or the rows "
        "in --input-data)",
    )
    load.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:D1,D2,...",
        help="dims of an input with variable dims, without the batch dimension (repeatable)",
    )
    load.add_argument(
        "--input-data",
        default="random",
        metavar="random|zero|FILE",
        help='input values: random (default), zero, a JSON file ({"INPUT": [...]}, '
        '{"INPUT": {"content": [...], "shape": [...]}} or perf_analyzer\'s '
        '{"data": [...]}, first entry) or an .npz file',
    )
    load.add_argument(
        "--cache-hit-ratio",
        type=_ratio,
        metavar="R",
        help="this fraction of the requests send the same inputs (answered by a response "
        "cache, once warm), the others new inputs each (misses); e.g. 0.8 (default: every "
        "request the same)",
    )
    load.add_argument(
        "--measurement-seconds",
        type=_seconds(True),
        default=5.0,
        metavar="S",
        help="measured seconds per concurrency (default: 5)",
    )
    load.add_argument(
        "--warmup-seconds",
        type=_seconds(False),
        default=1.0,
        metavar="S",
        help="unmeasured seconds before each measurement (default: 1)",
    )
    load.add_argument(
        "--max-requests",
        type=_positive_int,
        metavar="N",
        help="stop a measurement after this many requests, even before its seconds are up",
    )
    load.add_argument(
        "--workers",
        type=_positive_int,
        metavar="N",
        help="client processes (default: automatic, one more whenever a client process is "
        f"over {CLIENT_BUSY_LIMIT:.0%} busy, up to one per core)".replace("%", "%%"),
    )

    output = parser.add_argument_group("output")
    output.add_argument("--csv", type=Path, metavar="PATH", help="write one row per concurrency")
    output.add_argument(
        "--plot",
        type=Path,
        metavar="PATH.png",
        help="write throughput and latency against concurrency (needs matplotlib)",
    )
    output.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bar"
    )
    return parser


def _ratio(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _check_outputs(args: argparse.Namespace) -> None:
    """Refuse now what would only fail after the whole sweep."""
    for flag, path in (("--csv", args.csv), ("--plot", args.plot)):
        if path is not None and not path.parent.is_dir():
            raise UsageError(f"{flag} {path}: the directory {path.parent} does not exist")
    if args.plot is not None and importlib.util.find_spec("matplotlib") is None:
        raise UsageError("--plot needs matplotlib: pip install 'tensorgate[bench]'")
    if args.progress and sys.stderr.isatty() and importlib.util.find_spec("tqdm") is None:
        raise UsageError(
            "the progress bar needs tqdm: pip install 'tensorgate[bench]' (or --no-progress)"
        )


def _inputs(args: argparse.Namespace, model: ModelInfo) -> RequestInputs:
    shapes = dict(parse_shape_option(text) for text in args.shape)
    if args.input_data in ("random", "zero"):
        return generate_inputs(model, args.input_data, args.batch_size or 1, shapes)
    path = Path(args.input_data)
    return inputs_from_data(model, read_data_file(path), str(path), args.batch_size, shapes)


def _describe(args: argparse.Namespace, host: str, port: int, inputs: RequestInputs) -> str:
    wire = "gRPC" if args.protocol == "grpc" else f"HTTP {'binary' if args.binary else 'JSON'}"
    tensors = ", ".join(f"{t.name} {t.datatype.name} {list(t.array.shape)}" for t in inputs.tensors)
    version = args.model_version or "server's choice"
    return (
        f"{args.model} (version {version}) over {wire} at {host}:{port}; inputs {tensors}; "
        f"{inputs.rows} row(s) per request; {args.measurement_seconds:g} s per concurrency "
        f"after {args.warmup_seconds:g} s of warm-up"
        + ("" if args.cache_hit_ratio is None else
           f"; {args.cache_hit_ratio:.0%} of requests repeat one input set, the rest new")
    )


def _max_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def run(args: argparse.Namespace) -> int:
    """The whole command once the flags parsed; BenchError for anything the user must see."""
    if args.protocol == "grpc" and not args.binary:
        raise UsageError("--json applies to HTTP only (gRPC sends raw tensor contents)")
    if args.cache_hit_ratio is not None and not args.binary:
        raise UsageError("--cache-hit-ratio needs binary tensors (not --json)")
    _check_outputs(args)
    host, port = parse_url(args.url or "127.0.0.1", args.protocol)
    api: ServerApi = (
        GrpcServerApi(host, port) if args.protocol == "grpc" else HttpServerApi(host, port)
    )
    try:
        model = api.model_info(args.model, args.model_version)
        inputs = _inputs(args, model)
        outputs = [spec.name for spec in model.outputs]
        host_header = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"

        def encode(tensors: Sequence[Tensor]) -> bytes:
            if args.protocol == "grpc":
                return grpc_infer_request(args.model, args.model_version, tensors)
            return http_infer_request(
                host_header, args.model, args.model_version, tensors, outputs, args.binary
            )

        request = encode(inputs.tensors)
        mix = None
        if args.cache_hit_ratio is not None:
            mix = cache_mix.plan(args.cache_hit_ratio, inputs.tensors, encode)
        if args.protocol == "grpc":
            problems = check_grpc_response(api.probe(request), outputs)
        else:
            problems = check_http_response(api.probe(request), outputs)
        if problems:
            raise BenchError("the server refused the request: " + "; ".join(problems))
        print(_describe(args, host, port, inputs), flush=True)
        results = _sweep(args, api, model, inputs, LoadTarget(
            args.protocol, host, port, request, mix
        ), outputs)
    finally:
        api.close()
    failed = sum(r.errors for r in results)
    if failed:
        print(f"tensorgate-bench: {failed:,} requests failed", file=sys.stderr)
        return 1
    return 0


def _sweep(
    args: argparse.Namespace,
    api: ServerApi,
    model: ModelInfo,
    inputs: RequestInputs,
    target: LoadTarget,
    outputs: list[str],
) -> list[StepResult]:
    plan = SweepPlan(
        concurrencies=args.concurrency_range or args.concurrency or _DEFAULT_CONCURRENCY,
        measurement_s=args.measurement_seconds,
        warmup_s=args.warmup_seconds,
        max_requests=args.max_requests,
        workers=args.workers,
        max_workers=_max_workers(),
    )

    def check(raw: bytes) -> list[str]:
        if args.protocol == "grpc":
            return check_grpc_response(raw, outputs)
        return check_http_response(raw, outputs)

    progress = SweepProgress(
        plan.seconds_per_step * len(plan.concurrencies), args.progress and sys.stderr.isatty()
    )
    try:
        pool = WorkerPool(target, args.workers or 1)
    except BaseException:
        progress.close()
        raise
    sweep = Sweep(
        pool, plan, inputs.rows, lambda: api.counters(model.name, model.version), check, progress
    )
    try:
        return sweep.run()
    finally:  # a sweep cut short (Ctrl-C, a failure) still reports the steps it measured
        pool.shutdown()
        progress.close()
        if sweep.results:
            _report(args, sweep.results, sweep.notes, inputs.rows)


def _report(
    args: argparse.Namespace, results: list[StepResult], notes: list[str], rows: int
) -> None:
    print(table(results))
    for line in [*warnings(results), *(f"note: {n}" for n in notes)]:
        print(line)
    if any(r.server is None for r in results):
        print("note: the server has no statistics extension for this model: no server columns")
    if args.csv is not None:
        write_csv(args.csv, results)
        print(f"wrote {args.csv}", file=sys.stderr)
    if args.plot is not None:
        wire = "gRPC" if args.protocol == "grpc" else f"HTTP {'binary' if args.binary else 'JSON'}"
        title = f"{args.model} over {wire}, {rows} row(s) per request"
        write_plot(args.plot, results, title)
        print(f"wrote {args.plot}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point; the exit status says whether every request succeeded."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except UsageError as exc:
        parser.print_usage(sys.stderr)
        print(f"tensorgate-bench: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except BenchError as exc:
        print(f"tensorgate-bench: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("tensorgate-bench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
