"""Benchmark tensorgate against the real Triton, side by side in one run, with perf_analyzer.

Both servers run at once on 127.0.0.1 and free ports, on one copy of the example repository
(plus ``mlp_nobatch``: the example ``mlp`` without its ``dynamic_batching`` block), and
NVIDIA's perf_analyzer measures each in turn on these rows:

- ``simple-http``: ``simple`` over HTTP (perf_analyzer sends binary tensors), concurrency 8;
- ``simple-grpc``: ``simple`` over gRPC, concurrency 8;
- ``simple-http-c1`` / ``simple-grpc-c1``: the same at concurrency 1, one request at a time,
  where the latency of each is the cost of every hop it makes (no goal in issue 15);
- ``mlp-on`` / ``mlp-off``: ``mlp`` over gRPC, concurrency 32, dynamic batching on / off;
- ``identity-16mb``: ``identity_fp32`` with a 16 MiB FP32 input over HTTP, concurrency 1;
- ``identity-4mb-stream``: ``identity_fp32`` with 4 MiB inputs over gRPC ModelStreamInfer
  (``--streaming``), concurrency 4.

Each row is run ``--repeat`` times, the servers alternating which goes first; the tables show
the median (and the lowest) infer/s, the median p50/p99 latency, tensorgate ÷ Triton, batching
on ÷ off per server, and CPU µs per request per process: CPU time (psutil, user + system) over
each perf_analyzer run divided by the requests the server's statistics counted in that run.
tensorgate's processes are grouped by role (supervisor, executor, front ends; in one-process
mode the single process), Triton's as ``tritonserver`` and its python backend stubs, and
perf_analyzer's own CPU comes from its rusage. "Cores busy" is the CPU seconds of the server
and perf_analyzer together over the wall seconds of the run: below the machine's cores, a core
idled while requests waited elsewhere (a process queue, a run queue), so throughput is
bounded by that as well as by the CPU per request.

On the ``simple-http`` row a third server is measured after tensorgate in each repeat:
``scripts/http_floor.py``, our HTTP layer answering with canned bytes taken from tensorgate at the
start (``--floor off`` leaves it out). perf_analyzer sends it requests at the rate each of
tensorgate's front ends has just served (``--request-rate-range``: tensorgate's rate ÷ its front
ends), not 8 at a time: a process's CPU per request depends on how busy it is. At concurrency 8
the floor serves 15,000-25,000 requests/s at a third of the CPU per request it spends at 5,000/s,
and at those rates perf_analyzer's windows often stopped ending after a pass or two. Its CPU per
request is the protocol floor of issue 15's budget, printed beside the front ends' work beyond
it, the executor's and the whole server's. A last table starts tensorgate afresh with
``--frontends`` 0, 1, 2, 3 on the ``simple-http`` row, next to Triton measured in the same run.

    python scripts/bench_vs_triton.py [--rows simple-http,mlp-on,...] [--repeat 3]
        [--frontends-sweep on|off] [--floor on|off] [--tensorgate-args "--frontends=2"]
        [--json PATH]

Figures are for people, never a CI gate: on a shared 2-core machine only same-run ratios carry
from one run to the next. tensorgate is ``python -m server`` with ONNX Runtime and BLAS pinned
to one thread (``--backend-config=onnxruntime,intra_op_thread_count=1``); Triton is
``../shared/tools/triton-ref/serve.sh`` from the repository root (``--triton-ref`` or
``$TRITON_REF_DIR`` elsewhere; its README: setup once), a python-backend stand-in running the
same ONNX files with ONNX Runtime, one intra-op thread. perf_analyzer is
``.perf_analyzer/bin/perf_analyzer`` (``scripts/install_perf_analyzer.sh``; ``--perf-analyzer``
or ``$PERF_ANALYZER`` elsewhere). Every server started here is stopped by its PID, also on
Ctrl-C or an error: SIGTERM, then SIGKILL to it and its remaining descendants after a bound.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import http.client
import io
import json
import math
import os
import re
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack, closing
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType

import psutil

ROOT = Path(__file__).resolve().parent.parent
if __package__ in (None, ""):  # run as a file: make the `scripts` package importable
    sys.path.insert(0, str(ROOT))

from scripts.bench_common import (
    LOOPBACK_SERVER_ARGS,
    ONE_ORT_THREAD,
    PINNED_THREADS,
    fmt_number,
    fmt_ratio,
    interpreter_line,
    markdown_table,
)
from scripts.http_floor import capture

REPOSITORY = ROOT / "examples" / "model_repository"
MLP_OFF = "mlp_nobatch"
_HTTP_STARTED = re.compile(r"Started HTTPService at \S+:(\d+)")
_GRPC_STARTED = re.compile(r"Started GRPCInferenceService at \S+:(\d+)")
_START_TIMEOUT_S = 120.0  # Triton starts a python stub per model instance: tens of seconds
_STOP_TIMEOUT_S = 30.0
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True)
class Row:
    """One perf_analyzer workload, run against both servers."""

    key: str
    title: str
    model: str
    protocol: str  # "http" | "grpc"
    concurrency: int
    target: float | None  # tensorgate ÷ Triton asked for by issue 15 ("Done when")
    flags: tuple[str, ...] = ()  # more perf_analyzer flags


ROWS = (
    Row("simple-http", "simple HTTP binary c=8", "simple", "http", 8, 1.0),
    Row("simple-grpc", "simple gRPC c=8", "simple", "grpc", 8, 0.9),
    Row("simple-http-c1", "simple HTTP binary c=1", "simple", "http", 1, None),
    Row("simple-grpc-c1", "simple gRPC c=1", "simple", "grpc", 1, None),
    Row("mlp-on", "mlp gRPC c=32 batching on", "mlp", "grpc", 32, 0.8),
    Row("mlp-off", "mlp gRPC c=32 batching off", MLP_OFF, "grpc", 32, None),
    # 16 MiB of FP32 (dims [-1] after the batch dimension)
    Row("identity-16mb", "identity_fp32 16 MiB HTTP c=1", "identity_fp32", "http", 1, 2.3,
        ("--shape", "INPUT0:4194304")),
    # 4 MiB requests on one ModelStreamInfer stream per perf_analyzer thread
    Row("identity-4mb-stream", "identity_fp32 4 MiB gRPC stream c=4", "identity_fp32", "grpc",
        4, None, ("--shape", "INPUT0:1048576", "--streaming")),
)
ROW_KEYS = {row.key: row for row in ROWS}
SWEEP_ROW = ROW_KEYS["simple-http"]
BATCHING_TARGET = 3.0  # issue 15's goal: batching on ÷ off
FLOOR = "HTTP floor"  # scripts/http_floor.py, measured on SWEEP_ROW (see floor_rate)
#: Issue 15's CPU budget per small request, µs: (what, goal).
BUDGET = (
    ("HTTP protocol floor (scripts/http_floor.py at one front end's rate)", 180.0),
    ("front ends' work beyond the floor (front ends − floor)", 60.0),
    ("executor, unbatched request", 30.0),
    ("whole server", 300.0),
)


# --- pure pieces ------------------------------------------------------------------------------


def parse_rows(text: str) -> list[Row]:
    """``--rows``: comma-separated row keys, in the order of ROWS."""
    keys = [key.strip() for key in text.split(",") if key.strip()]
    unknown = [key for key in keys if key not in ROW_KEYS]
    if unknown or not keys:
        raise argparse.ArgumentTypeError(
            f"unknown rows {unknown}; choose from {', '.join(ROW_KEYS)}"
        )
    return [row for row in ROWS if row.key in keys]


def parse_pa_csv(text: str) -> dict[str, float]:
    """perf_analyzer's ``-f`` report: infer/s and p50/p99 latency (µs) of its one row."""
    reader = csv.DictReader(io.StringIO(text))
    for record in reader:
        return {
            "infer_per_s": float(record["Inferences/Second"]),
            "p50_us": float(record["p50 latency"]),
            "p99_us": float(record["p99 latency"]),
        }
    raise ValueError("perf_analyzer wrote no result row")


def tensorgate_role(cmdline: Sequence[str]) -> str:
    """A tensorgate child's role from its command line."""
    text = " ".join(cmdline)
    if "server.processes.executor" in text:
        return "executor"
    if "server.processes.frontend" in text:
        return "front ends"
    return "other"


def strip_dynamic_batching(config: str) -> str:
    """A config.pbtxt without its top-level ``dynamic_batching { ... }`` block."""
    match = re.search(r"^dynamic_batching\s*\{", config, re.MULTILINE)
    if match is None:
        return config
    depth, index = 0, match.end() - 1
    for index in range(match.end() - 1, len(config)):
        depth += {"{": 1, "}": -1}.get(config[index], 0)
        if depth == 0:
            break
    return config[: match.start()] + config[index + 1 :].lstrip("\n")


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


# --- processes --------------------------------------------------------------------------------


# Resolved once here, so that the child between fork and exec only makes the system call.
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def _die_with_us() -> None:
    """In the child before exec: SIGTERM it when this process dies, however it dies (also
    SIGKILL), so that no server outlives the benchmark. Only a prctl runs between fork and
    exec: none of the locks that make ``preexec_fn`` unsafe with threads is taken."""
    if _prctl is not None:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    with closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def cpu_s(process: psutil.Process) -> float | None:
    try:
        times = process.cpu_times()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None
    return float(times.user + times.system)


class ServerProcess:
    """A server started here, in its own session, with its output kept for error reports."""

    name = "server"
    needs_grpc = True  # ready only once its gRPC port accepts connections too

    def __init__(self, argv: Sequence[str], env: dict[str, str]) -> None:
        self.lines: list[str] = []
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        self._known: dict[int, psutil.Process] = {}
        self._logged = threading.Event()
        self.proc = subprocess.Popen(
            list(argv),
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # a Ctrl-C reaches this script only: it stops them in order
            preexec_fn=_die_with_us,  # noqa: PLW1509 (a prctl only, see _die_with_us)
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            self.on_line(line)

    def on_line(self, line: str) -> None:
        match = _HTTP_STARTED.search(line)
        if match and self.http_port is None:
            self.http_port = int(match.group(1))

    def log_tail(self, count: int = 30) -> str:
        return "".join(self.lines[-count:])

    def wait_ready(self, timeout: float = _START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reader.join(5)
                raise RuntimeError(
                    f"{self.name} exited with {self.proc.returncode}:\n{self.log_tail()}"
                )
            if self._ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.name} was not ready within {timeout:.0f} s:\n{self.log_tail()}")

    def _ready(self) -> bool:
        if self.http_port is None or (self.needs_grpc and self.grpc_port is None):
            return False
        try:
            if get_status(self.http_port, "/v2/health/ready") != 200:
                return False
            if self.grpc_port is None:
                return True
            with closing(socket.create_connection(("127.0.0.1", self.grpc_port), timeout=2)):
                return True
        except OSError:
            return False

    def processes(self) -> list[tuple[str, psutil.Process]]:
        """The processes whose CPU time counts, each with its role."""
        raise NotImplementedError

    def _descendants(self) -> list[psutil.Process]:
        try:
            found = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            found = []
        for process in found:
            self._known.setdefault(process.pid, process)
        return found

    def stop(self) -> None:
        """SIGTERM the process started here; after a bound SIGKILL it, then SIGKILL by PID
        whatever of its descendants (seen now or earlier) is still there."""
        self._descendants()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                print(f"{self.name} ignored SIGTERM for {_STOP_TIMEOUT_S:.0f} s: SIGKILL",
                      file=sys.stderr)
                self.proc.kill()
                self.proc.wait(10)
        _gone, alive = psutil.wait_procs(list(self._known.values()), timeout=10)
        for process in alive:
            try:
                process.kill()  # psutil refuses a PID that now names another process
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        self._reader.join(5)


class Tensorgate(ServerProcess):
    name = "tensorgate"

    def __init__(self, repository: Path, extra_args: Sequence[str]) -> None:
        self.args = list(extra_args)
        super().__init__(
            [sys.executable, "-m", "server", f"--model-repository={repository}",
             *LOOPBACK_SERVER_ARGS, *extra_args],
            {**os.environ, **PINNED_THREADS, "PYTHONUNBUFFERED": "1"},
        )

    def on_line(self, line: str) -> None:
        super().on_line(line)
        match = _GRPC_STARTED.search(line)
        if match and self.grpc_port is None:
            self.grpc_port = int(match.group(1))

    def processes(self) -> list[tuple[str, psutil.Process]]:
        root = psutil.Process(self.proc.pid)
        children = []
        for process in self._descendants():
            try:
                children.append((tensorgate_role(process.cmdline()), process))
            except psutil.NoSuchProcess:
                continue
        if not any(role != "other" for role, _ in children):
            return [("one process", root), *children]
        return [("supervisor", root), *children]


class Triton(ServerProcess):
    name = "Triton"

    def __init__(self, triton_ref: Path, repository: Path, extra_args: Sequence[str]) -> None:
        http_port, grpc_port, metrics_port = free_port(), free_port(), free_port()
        super().__init__(
            ["bash", str(triton_ref / "serve.sh"), f"--model-repository={repository}",
             f"--http-port={http_port}", f"--grpc-port={grpc_port}",
             f"--metrics-port={metrics_port}", "--exit-timeout-secs=10", *extra_args],
            {**os.environ, **PINNED_THREADS},
        )
        self.http_port, self.grpc_port = http_port, grpc_port

    def processes(self) -> list[tuple[str, psutil.Process]]:
        found = []
        for process in self._descendants():
            try:
                name = process.name()
            except psutil.NoSuchProcess:
                continue
            if name == "tritonserver":
                found.append(("tritonserver", process))
            elif name.startswith("triton_python"):
                found.append(("python stubs", process))
        return found


class HttpFloorServer(ServerProcess):
    """``scripts/http_floor.py``: our HTTP layer answering with ``answers`` (HTTP only)."""

    name = "HTTP floor"
    needs_grpc = False

    def __init__(self, answers: Path) -> None:
        super().__init__(
            [sys.executable, str(ROOT / "scripts" / "http_floor.py"), f"--answers={answers}"],
            {**os.environ, **PINNED_THREADS, "PYTHONUNBUFFERED": "1"},
        )

    def processes(self) -> list[tuple[str, psutil.Process]]:
        return [("floor", psutil.Process(self.proc.pid))]


def get_status(port: int, path: str) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status
    finally:
        connection.close()


def model_counts(port: int, model: str) -> tuple[int, int, int] | None:
    """Successful requests, inferences and executions of the model so far, from the statistics
    extension (inferences ÷ executions is the mean executed batch size)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request("GET", f"/v2/models/{model}/stats")
        response = connection.getresponse()
        body = response.read()
        if response.status != 200:
            return None
        stats = json.loads(body)["model_stats"]
        return (
            sum(int(s["inference_stats"]["success"]["count"]) for s in stats),
            sum(int(s["inference_count"]) for s in stats),
            sum(int(s["execution_count"]) for s in stats),
        )
    except (OSError, ValueError, KeyError):
        return None
    finally:
        connection.close()


# --- one perf_analyzer run --------------------------------------------------------------------


@dataclass
class Measurement:
    """What one perf_analyzer run against one server measured."""

    server: str
    row: str
    infer_per_s: float = float("nan")
    p50_us: float = float("nan")
    p99_us: float = float("nan")
    stable: bool = True
    requests: int | None = None  # counted by the server over the whole perf_analyzer run
    mean_batch: float = float("nan")  # inferences ÷ executions over the run
    cpu_s: dict[str, float] = field(default_factory=dict)  # role -> CPU seconds over the run
    processes: dict[str, int] = field(default_factory=dict)  # role -> how many
    wall_s: float = float("nan")  # over which cpu_s was spent
    error: str | None = None

    def cpu_us_per_request(self, role: str) -> float:
        if not self.requests or role not in self.cpu_s:
            return float("nan")
        return self.cpu_s[role] / self.requests * 1e6

    def cores_busy(self) -> float:
        """The cores the server and perf_analyzer kept busy together, on average."""
        if not self.cpu_s or not self.wall_s > 0:
            return float("nan")
        return sum(self.cpu_s.values()) / self.wall_s


@dataclass(frozen=True)
class Settings:
    perf_analyzer: Path
    window_ms: int
    stability: int
    max_trials: int


def run_perf_analyzer(
    settings: Settings, argv: Sequence[str], window_ms: int, stability: int, max_trials: int
) -> tuple[int, str, str | None, float]:
    """Run perf_analyzer to its end (bounded): exit status, output, CSV text, and its own CPU
    seconds (from wait4's rusage, so nothing of it is missed)."""
    timeout = 60 + max_trials * window_ms / 1000 * 4
    with tempfile.TemporaryDirectory(prefix="bench_vs_triton.") as work, \
            open(Path(work) / "out.txt", "w+") as out:
        report = Path(work) / "report.csv"
        proc = subprocess.Popen(
            [str(settings.perf_analyzer), *argv, "--measurement-mode=time_windows",
             f"--measurement-interval={window_ms}", f"--stability-percentage={stability}",
             f"--max-trials={max_trials}", "-f", str(report)],
            stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_us,  # noqa: PLW1509 (a prctl only, see _die_with_us)
        )
        deadline = time.monotonic() + timeout
        try:
            while True:
                pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
                if pid:
                    break
                if time.monotonic() > deadline:  # not reaped yet: the PID is still its own
                    proc.kill()
                    pid, status, usage = os.wait4(proc.pid, 0)
                    break
                time.sleep(0.1)
        except BaseException:
            if proc.returncode is None:
                proc.kill()
                proc.wait()
            raise
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        text = out.read()
        csv_text = report.read_text() if report.exists() else None
    return proc.returncode, text, csv_text, usage.ru_utime + usage.ru_stime


def measure(
    settings: Settings,
    server: ServerProcess,
    row: Row,
    label: str,
    warm_up: bool = False,
    rate: float | None = None,
) -> Measurement:
    """perf_analyzer on ``row`` against ``server``, with the CPU time of every process; a run
    that does not stabilise is rerun once over exactly three windows (marked unstable). With
    ``rate``, requests are sent at that rate (per second) instead of ``row``'s concurrency."""
    port = server.http_port if row.protocol == "http" else server.grpc_port
    assert port is not None and server.http_port is not None
    load = (f"--concurrency-range={row.concurrency}" if rate is None else
            f"--request-rate-range={rate:.0f}")
    argv = ["-m", row.model, "-u", f"127.0.0.1:{port}", "-i", row.protocol, load, *row.flags]
    result = Measurement(label, row.key)
    if warm_up:
        run_perf_analyzer(settings, argv, 300, 1000, 3)
        return result
    for attempt in range(2):
        stability, trials = (settings.stability, settings.max_trials) if attempt == 0 else (
            1000, 3)
        before_counts = model_counts(server.http_port, row.model)
        started = time.monotonic()
        before = {p.pid: (role, p, cpu_s(p)) for role, p in server.processes()}
        rc, output, csv_text, pa_cpu = run_perf_analyzer(
            settings, argv, settings.window_ms, stability, trials)
        after = server.processes()
        after_counts = model_counts(server.http_port, row.model)
        wall_s = time.monotonic() - started
        if csv_text is None and attempt == 0 and "stable measurement" in output:
            continue
        break
    result.stable = attempt == 0
    if rc != 0 or csv_text is None:
        lines = [line for line in output.splitlines() if line.strip()]
        result.error = f"perf_analyzer exited {rc}: " + " | ".join(lines[-3:])
        return result
    result.__dict__.update(parse_pa_csv(csv_text))
    if before_counts is not None and after_counts is not None:
        requests, inferences, executions = (a - b for a, b in zip(after_counts, before_counts,
                                                                   strict=True))
        result.requests = requests
        result.mean_batch = inferences / executions if executions else float("nan")
    for role, process in after:
        now = cpu_s(process)
        if now is None:
            continue
        previous = before.get(process.pid)
        spent = now - (previous[2] or 0.0) if previous is not None else now
        result.cpu_s[role] = result.cpu_s.get(role, 0.0) + spent
        result.processes[role] = result.processes.get(role, 0) + 1
    result.cpu_s["perf_analyzer"] = pa_cpu
    result.processes["perf_analyzer"] = 1
    result.wall_s = wall_s
    return result


# --- the run ----------------------------------------------------------------------------------


def floor_rate(served: Measurement) -> float | None:
    """The rate the floor is sent, per second: what each of tensorgate's front ends served in
    ``served`` (all of it in one process), for the floor, one process, to run as busy as one
    front end. None when ``served`` measured nothing."""
    if served.error is not None or not served.infer_per_s > 0:
        return None
    return served.infer_per_s / served.processes.get("front ends", 1)


def write_repository(base: Path) -> Path:
    """The example repository plus ``mlp_nobatch`` (``mlp`` without dynamic batching)."""
    repository = base / "models"
    shutil.copytree(REPOSITORY, repository, ignore=shutil.ignore_patterns("README.md"))
    off = repository / MLP_OFF
    shutil.copytree(repository / "mlp", off)
    config = strip_dynamic_batching((off / "config.pbtxt").read_text())
    config = re.sub(r'^name:\s*"mlp"', f'name: "{MLP_OFF}"', config, flags=re.MULTILINE)
    assert "dynamic_batching" not in config and MLP_OFF in config
    (off / "config.pbtxt").write_text(config)
    return repository


def start(server: ServerProcess, stack: ExitStack) -> ServerProcess:
    stack.callback(server.stop)
    server.wait_ready()
    return server


@dataclass
class Results:
    main: list[Measurement] = field(default_factory=list)
    sweep: list[Measurement] = field(default_factory=list)
    seconds: float = 0.0


def progress(measurement: Measurement) -> None:
    what = (measurement.error if measurement.error else
            f"{measurement.infer_per_s:,.0f} infer/s, p50 {measurement.p50_us / 1000:.2f} ms"
            + ("" if measurement.stable else " (unstable)"))
    print(f"  {measurement.row:<14} {measurement.server:<24} {what}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace, settings: Settings) -> Results:
    results = Results()
    began = time.monotonic()
    tg_args = shlex.split(args.tensorgate_args)
    with ExitStack() as stack:
        base = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="bench_vs_triton.")))
        repository = write_repository(base)
        print("starting tensorgate and Triton ...", file=sys.stderr, flush=True)
        triton = start(Triton(args.triton_ref, repository, shlex.split(args.triton_args)), stack)
        with ExitStack() as tg_stack:
            tensorgate = start(Tensorgate(repository, tg_args), tg_stack)
            servers = {"tensorgate": tensorgate, "Triton": triton}
            floor = None
            if args.floor == "on" and SWEEP_ROW in args.rows:
                assert tensorgate.http_port is not None
                answers = base / "floor.json"
                answers.write_text(json.dumps(capture(tensorgate.http_port, SWEEP_ROW.model)))
                floor = start(HttpFloorServer(answers), tg_stack)
                measure(settings, floor, SWEEP_ROW, FLOOR, warm_up=True, rate=1000)
            for row in args.rows:
                for label, server in servers.items():
                    measure(settings, server, row, label, warm_up=True)
            for repeat in range(args.repeat):
                print(f"repeat {repeat + 1}/{args.repeat}", file=sys.stderr, flush=True)
                for index, row in enumerate(args.rows):
                    order = list(servers.items())
                    if (repeat + index) % 2:
                        order.reverse()
                    served = Measurement("tensorgate", row.key)  # (measured in this loop)
                    for label, server in order:
                        results.main.append(measure(settings, server, row, label))
                        progress(results.main[-1])
                        if label == "tensorgate":
                            served = results.main[-1]
                    if floor is not None and row == SWEEP_ROW:
                        rate = floor_rate(served)
                        if rate is None:
                            print(f"  {row.key:<14} {FLOOR:<24} skipped: no tensorgate rate",
                                  file=sys.stderr, flush=True)
                        else:
                            results.main.append(measure(settings, floor, row, FLOOR, rate=rate))
                            progress(results.main[-1])
        if args.frontends_sweep == "on":
            sweep(args, settings, repository, triton, tg_args, results)
    results.seconds = time.monotonic() - began
    return results


def sweep(
    args: argparse.Namespace,
    settings: Settings,
    repository: Path,
    triton: ServerProcess,
    tg_args: list[str],
    results: Results,
) -> None:
    """tensorgate started afresh per ``--frontends`` value on SWEEP_ROW, Triton alongside."""
    print("--frontends sweep", file=sys.stderr, flush=True)
    for repeat in range(args.repeat):
        if repeat % 2:  # alternate: Triton first on odd repeats, last on even ones
            results.sweep.append(measure(settings, triton, SWEEP_ROW, "Triton"))
            progress(results.sweep[-1])
        for count in args.sweep_values:
            label = f"--frontends={count}"
            with ExitStack() as stack:
                server = start(Tensorgate(repository, [*tg_args, label]), stack)
                measure(settings, server, SWEEP_ROW, label, warm_up=True)  # a fresh process
                results.sweep.append(measure(settings, server, SWEEP_ROW, label))
                progress(results.sweep[-1])
        if not repeat % 2:
            results.sweep.append(measure(settings, triton, SWEEP_ROW, "Triton"))
            progress(results.sweep[-1])


# --- report -----------------------------------------------------------------------------------


def pick(measurements: Sequence[Measurement], server: str, row: str) -> list[Measurement]:
    return [m for m in measurements if m.server == server and m.row == row and m.error is None]


def rate(values: Sequence[Measurement]) -> float:
    return median([m.infer_per_s for m in values])


def rate_cell(values: Sequence[Measurement]) -> str:
    if not values:
        return "n/a"
    text = fmt_number(rate(values))
    if len(values) > 1:
        text += f" (min {fmt_number(min(m.infer_per_s for m in values))})"
    if not all(m.stable for m in values):
        text += " †"
    return text


def latency_cell(values: Sequence[Measurement]) -> str:
    if not values:
        return "n/a"
    p50 = median([m.p50_us for m in values]) / 1000
    p99 = median([m.p99_us for m in values]) / 1000
    return f"{fmt_number(p50)} / {fmt_number(p99)}"


def ratio(numerator: float, denominator: float) -> float:
    if denominator > 0 and not math.isnan(numerator):
        return numerator / denominator
    return float("nan")


def ratio_cell(value: float) -> str:
    return "n/a" if math.isnan(value) else fmt_ratio(value)


def server_us(values: Sequence[Measurement]) -> float:
    """The median CPU µs per request of the server's processes together."""
    if not values or not all(m.requests for m in values):
        return float("nan")
    return median([sum(cpu for role, cpu in m.cpu_s.items() if role != "perf_analyzer")
                   / (m.requests or 1) * 1e6 for m in values])


def role_us(values: Sequence[Measurement], role: str) -> float:
    """The median CPU µs per request of one role's processes (n/a where it has none, or where
    a run has no request count: a median over NaN would be arbitrary)."""
    if not values or not all(m.requests for m in values):
        return float("nan")
    return median([m.cpu_us_per_request(role) for m in values])


def cpu_cells(values: Sequence[Measurement]) -> tuple[str, str, str, str]:
    """Server total, per role, perf_analyzer: median CPU µs per request; and the median
    cores busy."""
    if not values or not all(m.requests for m in values):
        return "n/a", "n/a", "n/a", "n/a"
    roles = [role for role in values[-1].cpu_s if role != "perf_analyzer"]
    total = server_us(values)
    parts = []
    for role in roles:
        count = values[-1].processes.get(role, 1)
        name = f"{role} ({count})" if count > 1 else role
        parts.append(f"{name} {fmt_number(role_us(values, role))}")
    pa = role_us(values, "perf_analyzer")
    busy = median([m.cores_busy() for m in values])
    return fmt_number(total), " · ".join(parts), fmt_number(pa), fmt_number(busy)


def budget_rows(measurements: Sequence[Measurement]) -> list[list[str]]:
    """Issue 15's CPU budget on SWEEP_ROW: measured µs per request beside each goal. The front
    ends' work beyond the floor is their CPU less the floor's; with tensorgate in one process
    it and the executor's are n/a."""
    tensorgate = pick(measurements, "tensorgate", SWEEP_ROW.key)
    floor = server_us(pick(measurements, FLOOR, SWEEP_ROW.key))
    measured = (
        floor,
        role_us(tensorgate, "front ends") - floor,
        role_us(tensorgate, "executor"),
        server_us(tensorgate),
    )
    return [[what, fmt_number(value), f"≤ {goal:g}",
             "n/a" if math.isnan(value) else "met" if value <= goal else "not met"]
            for (what, goal), value in zip(BUDGET, measured, strict=True)]


def report(args: argparse.Namespace, results: Results) -> str:
    out: list[str] = []
    errors = [m for m in results.main + results.sweep if m.error]
    rows = []
    for row in args.rows:
        tg, tr = pick(results.main, "tensorgate", row.key), pick(results.main, "Triton", row.key)
        rows.append([
            row.title, rate_cell(tg), rate_cell(tr), ratio_cell(ratio(rate(tg), rate(tr))),
            "—" if row.target is None else f"≥ {row.target:g}×",
            latency_cell(tg), latency_cell(tr),
        ])
    out.append("### tensorgate vs Triton (perf_analyzer; medians of "
               f"{args.repeat}; infer/s (min); latency ms)\n")
    out.append(markdown_table(
        ["row", "tensorgate infer/s", "Triton infer/s", "tg ÷ Triton", "target",
         "tg p50 / p99", "Triton p50 / p99"], rows))
    keys = {row.key for row in args.rows}
    if {"mlp-on", "mlp-off"} <= keys:
        batching = []
        for server in ("tensorgate", "Triton"):
            on, off = pick(results.main, server, "mlp-on"), pick(results.main, server, "mlp-off")
            batching.append([server, fmt_number(rate(on)), fmt_number(rate(off)),
                             ratio_cell(ratio(rate(on), rate(off))),
                             fmt_number(median([m.mean_batch for m in on]))])
        out.append(f"\n### mlp gRPC c=32: dynamic batching on ÷ off (goal ≥ {BATCHING_TARGET:g}×)\n")
        out.append(markdown_table(["server", "on infer/s", "off infer/s", "on ÷ off",
                                         "mean batch (on)"], batching))
    cpu_rows = []
    for row in args.rows:
        for server in ("tensorgate", "Triton", FLOOR):
            values = pick(results.main, server, row.key)
            if values or server != FLOOR:
                cpu_rows.append([row.title, server, *cpu_cells(values)])
    out.append("\n### CPU µs per request (psutil user+system over each perf_analyzer run ÷ "
               "requests the server counted; medians), and the cores server and "
               f"perf_analyzer kept busy together (of {len(os.sched_getaffinity(0))})\n")
    out.append(markdown_table(["row", "server", "server total", "by process", "perf_analyzer",
                               "cores busy"], cpu_rows))
    if SWEEP_ROW in args.rows:
        floor = pick(results.main, FLOOR, SWEEP_ROW.key)
        served = f" (the floor served {rate_cell(floor)} infer/s)" if floor else ""
        out.append(f"\n### CPU budget per request (issue 15): {SWEEP_ROW.title}, µs"
                   f"{served}\n")
        out.append(markdown_table(["what", "measured", "goal", ""],
                                  budget_rows(results.main)))
    if args.frontends_sweep == "on":
        out.append(f"\n### --frontends sweep: {SWEEP_ROW.title} (each a fresh tensorgate)\n")
        triton = pick(results.sweep, "Triton", SWEEP_ROW.key)
        sweep_rows = []
        for label in [f"--frontends={n}" for n in args.sweep_values] + ["Triton"]:
            values = pick(results.sweep, label, SWEEP_ROW.key)
            total, parts, pa, busy = cpu_cells(values)
            sweep_rows.append([label, rate_cell(values), ratio_cell(
                ratio(rate(values), rate(triton))), latency_cell(values), total, parts, pa,
                busy])
        out.append(markdown_table(
            ["server", "infer/s", "÷ Triton", "p50 / p99 ms", "CPU µs/req", "by process",
             "perf_analyzer µs/req", "cores busy"], sweep_rows))
    notes = [
        (f"perf_analyzer: time windows of {args.window_ms} ms, stability {args.stability} %, "
         f"at most {args.max_trials} windows; † = did not stabilise, rerun over exactly 3 "
         "windows."),
        f"tensorgate: {ONE_ORT_THREAD} {args.tensorgate_args}".rstrip()
        + f"; {len(os.sched_getaffinity(0))} CPUs, load average {os.getloadavg()[0]:.2f} at the "
        f"end; run took {results.seconds:.0f} s.",
        interpreter_line("tensorgate"),
    ]
    out.append("\n" + "\n".join(notes))
    for m in errors:
        out.append(f"\nerror: {m.server} {m.row}: {m.error}")
    return "\n".join(out)


# --- main -------------------------------------------------------------------------------------


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=parse_rows, default=list(ROWS),
                        help=f"comma-separated rows (default all): {','.join(ROW_KEYS)}")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row and server")
    parser.add_argument("--frontends-sweep", choices=("on", "off"), default="on",
                        help="the --frontends table on simple-http (default on)")
    parser.add_argument("--sweep-values", type=lambda s: [int(v) for v in s.split(",")],
                        default=[0, 1, 2, 3], help="--frontends values (default 0,1,2,3)")
    parser.add_argument("--floor", choices=("on", "off"), default="on",
                        help="measure the HTTP protocol floor on simple-http (default on)")
    parser.add_argument("--tensorgate-args", default="",
                        help="more tensorgate flags, one shell-quoted string")
    parser.add_argument("--triton-args", default="", help="more tritonserver flags")
    parser.add_argument("--window-ms", type=int, default=2000,
                        help="perf_analyzer measurement window (default 2000)")
    parser.add_argument("--stability", type=int, default=25,
                        help="perf_analyzer stability percentage (default 25)")
    parser.add_argument("--max-trials", type=int, default=6,
                        help="perf_analyzer windows at most (default 6)")
    parser.add_argument("--perf-analyzer", type=Path, default=Path(
        os.environ.get("PERF_ANALYZER") or ROOT / ".perf_analyzer" / "bin" / "perf_analyzer"))
    parser.add_argument("--triton-ref", type=Path, default=Path(
        os.environ.get("TRITON_REF_DIR") or ROOT.parent / "shared" / "tools" / "triton-ref"))
    parser.add_argument("--json", type=Path, help="also write every measurement to this file")
    args = parser.parse_args(argv)
    if args.repeat < 1 or args.window_ms < 100 or args.max_trials < 3:
        parser.error("--repeat >= 1, --window-ms >= 100 and --max-trials >= 3 please")
    if not os.access(args.perf_analyzer, os.X_OK):
        parser.error(f"no perf_analyzer at {args.perf_analyzer} "
                     "(scripts/install_perf_analyzer.sh, or --perf-analyzer)")
    if not (args.triton_ref / "serve.sh").is_file():
        parser.error(f"no serve.sh in {args.triton_ref} (--triton-ref or $TRITON_REF_DIR)")
    return args


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt  # unwinds through the ExitStacks: every server is stopped


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    signal.signal(signal.SIGTERM, _terminate)
    settings = Settings(args.perf_analyzer, args.window_ms, args.stability, args.max_trials)
    try:
        results = run(args, settings)
    except KeyboardInterrupt:
        print("interrupted: the servers were stopped", file=sys.stderr)
        return 130
    print(report(args, results))
    if args.json:
        args.json.write_text(json.dumps(
            {"main": [asdict(m) for m in results.main],
             "sweep": [asdict(m) for m in results.sweep]},
            indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
