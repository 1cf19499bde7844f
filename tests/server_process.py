"""Start the real server as a subprocess on free ports, for integration tests.

The server runs in its own process (as users run it, through the real CLI); ``--http-port=0``
and ``--grpc-port=0`` make it pick free ports, which it logs as ``Started HTTPService at
ADDR:PORT`` and ``Started GRPCInferenceService at ADDR:PORT``.
"""

from __future__ import annotations

import argparse
import http.client
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

import psutil

from server.cli import parse_bool

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"
_HTTP_STARTED = re.compile(r"Started HTTPService at \S+:(\d+)")
_GRPC_STARTED = re.compile(r"Started GRPCInferenceService at \S+:(\d+)")
_METRICS_STARTED = re.compile(r"Started Metrics Service at \S+:(\d+)")
# One intra-op thread per session: the test machines have two cores.
DEFAULT_ARGS = ("--backend-config=onnxruntime,intra_op_thread_count=1",)
#: A file that ``record_layout_module`` appends to (set by ``scripts/test.sh``).
LAYOUT_LOG = "TENSORGATE_TEST_LAYOUT_LOG"


def record_layout_module(nodeid: str | None = None) -> None:
    """Note the module of test ``nodeid`` (default: the one running) as one whose servers take
    their process layout from ``TENSORGATE_TEST_FRONTENDS``. ``scripts/test.sh`` runs the
    modules noted in its first pass again in the other layout, and only those: the rest would
    run the same code twice (unit tests, servers started with ``--frontends`` of their own or
    spawned directly)."""
    path = os.environ.get(LAYOUT_LOG)
    nodeid = os.environ.get("PYTEST_CURRENT_TEST", "") if nodeid is None else nodeid
    if path and nodeid:
        with open(path, "a", encoding="utf-8") as log:  # one short append per line
            log.write(nodeid.split("::", 1)[0] + "\n")


def _flag_enabled(args: Sequence[str], flag: str) -> bool:
    """The value the server will give a boolean ``flag`` (default true; the last one wins)."""
    enabled = True
    for index, arg in enumerate(args):
        if arg.startswith(flag + "="):
            try:
                enabled = parse_bool(arg.partition("=")[2])
            except argparse.ArgumentTypeError:  # the server refuses it and exits
                pass
        elif arg == flag:
            following = args[index + 1] if index + 1 < len(args) else ""
            try:
                enabled = parse_bool(following)
            except argparse.ArgumentTypeError:  # a bare boolean flag means true
                enabled = True
    return enabled


class ServerProcess:
    """A running server; ``log`` collects everything it printed.

    ``port`` is the HTTP port and ``grpc_port`` the gRPC one, each None until the server has
    logged it (or when its endpoint is off). Start-up waits for the line of every endpoint the
    flags enable.
    """

    def __init__(
        self,
        args: list[str],
        timeout: float = 60.0,
        probe_headers: dict[str, str] | None = None,
        script: str | None = None,
    ) -> None:
        """``probe_headers``: sent with the liveness probe that ends the start-up (a restricted
        health API needs its header). ``script``: a script of the repository to run with
        ``args`` instead of the server, one that serves HTTP only and logs its port as the
        server does (``scripts/http_floor.py``)."""
        self._probe_headers = probe_headers
        self.lines: list[str] = []
        self.port: int | None = None
        self.grpc_port: int | None = None
        self.metrics_port: int | None = None
        self._want_http = script is not None or _flag_enabled(args, "--allow-http")
        self._want_grpc = script is None and _flag_enabled(args, "--allow-grpc")
        # The suites run in both process layouts: TENSORGATE_TEST_FRONTENDS=0 (one process),
        # or N front ends and an executor; unset, the server's own default.
        frontends = os.environ.get("TENSORGATE_TEST_FRONTENDS")
        if script is None and not any(a.startswith("--frontends") for a in args):
            record_layout_module()
            if frontends is not None:
                args = [*args, f"--frontends={frontends}"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, *(["-m", "server"] if script is None else [script]), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=ROOT,
            env=env,
        )
        self._started = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        deadline = time.monotonic() + timeout
        while not self._started.wait(0.05):
            if self.proc.poll() is not None:
                self._reader.join(5)
                return
            if time.monotonic() > deadline:  # still starting: ``timeout=0`` does not wait
                return
        if self.port is not None:
            self._wait_live(deadline)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            http_match = _HTTP_STARTED.search(line)
            if http_match and self.port is None:
                self.port = int(http_match.group(1))
            metrics_match = _METRICS_STARTED.search(line)
            if metrics_match and self.metrics_port is None:
                self.metrics_port = int(metrics_match.group(1))
            grpc_match = _GRPC_STARTED.search(line)
            if grpc_match and self.grpc_port is None:
                self.grpc_port = int(grpc_match.group(1))
            if self._all_started():
                self._started.set()
        self.proc.stdout.close()

    def _all_started(self) -> bool:
        """Every enabled endpoint has logged its port (with none enabled, nothing to wait for)."""
        if not (self._want_http or self._want_grpc):
            return False
        return (not self._want_http or self.port is not None) and (
            not self._want_grpc or self.grpc_port is not None
        )

    def _wait_live(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                if self.request("GET", "/v2/health/live", headers=self._probe_headers)[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_for_log(self, text: str, timeout: float = 30.0) -> None:
        """Wait until the server has printed ``text``."""
        deadline = time.monotonic() + timeout
        while text not in self.log:
            assert time.monotonic() < deadline and self.proc.poll() is None, self.log
            time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def grpc_url(self) -> str:
        """``127.0.0.1:PORT`` of the gRPC service, as ``tritonclient.grpc`` takes it."""
        assert self.grpc_port is not None, self.log
        return f"127.0.0.1:{self.grpc_port}"

    def metrics(self) -> str:
        """The ``/metrics`` page (the server must have been started with metrics on)."""
        assert self.metrics_port is not None, self.log
        conn = http.client.HTTPConnection("127.0.0.1", self.metrics_port, timeout=30)
        try:
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            body = response.read().decode()
            assert response.status == 200, (response.status, body)
            assert response.getheader("Content-Type") == "text/plain; charset=utf-8"
            return body
        finally:
            conn.close()

    def request(
        self,
        method: str,
        path: str,
        body: bytes | str | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, dict[str, str], bytes]:
        """One HTTP request on a fresh connection: (status, headers, body)."""
        assert self.port is not None, self.log
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def resident_bytes(self) -> int:
        """The resident memory of the server's processes together: in the split layout the
        first process is the supervisor, and the front ends and executor hold the requests."""
        total = 0
        first = psutil.Process(self.proc.pid)
        for process in (first, *first.children(recursive=True)):
            try:
                total += process.memory_info().rss
            except psutil.NoSuchProcess:  # (a model's process that ended meanwhile)
                continue
        return total

    def stop(self, timeout: float = 20.0) -> int:
        """SIGTERM the server (this process only) and return its exit code."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._reader.join(5)
        return self.proc.returncode

    def wait_exit(self, timeout: float = 60.0) -> int:
        self.proc.wait(timeout)
        self._reader.join(5)
        return self.proc.returncode


def one_front_end() -> tuple[str, ...]:
    """Flags for a test of what one process holds (a budget, its descriptors): one front end
    in the split layout (each front end has its own share), the one process otherwise."""
    return () if os.environ.get("TENSORGATE_TEST_FRONTENDS") == "0" else ("--frontends=1",)


def start_server(
    *repositories: Path,
    args: tuple[str, ...] = (),
    timeout: float = 60.0,
    probe_headers: dict[str, str] | None = None,
) -> ServerProcess:
    """Start a server on ``repositories``, HTTP and gRPC on 127.0.0.1 and free ports (``args``
    come last, so they override these); ``probe_headers`` as ``ServerProcess`` takes them."""
    argv = [f"--model-repository={repo}" for repo in repositories]
    argv += ["--http-port=0", "--http-address=127.0.0.1"]
    argv += ["--grpc-port=0", "--grpc-address=127.0.0.1"]
    argv += ["--metrics-port=0", "--metrics-address=127.0.0.1", *DEFAULT_ARGS, *args]
    return ServerProcess(argv, timeout, probe_headers)
