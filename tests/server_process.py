"""Start the real server as a subprocess on free ports, for integration tests.

The server runs in its own process (as users run it, through the real CLI); ``--http-port=0``
makes it pick a free port, which it logs as ``Started HTTPService at ADDR:PORT``.
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples" / "model_repository"
_STARTED = re.compile(r"Started HTTPService at \S+:(\d+)")
# One intra-op thread per session: the test machines have two cores.
DEFAULT_ARGS = ("--backend-config=onnxruntime,intra_op_thread_count=1",)


class ServerProcess:
    """A running server; ``log`` collects everything it printed."""

    def __init__(self, args: list[str], timeout: float = 60.0) -> None:
        self.lines: list[str] = []
        self.port: int | None = None
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "server", *args],
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
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self._reader.join(5)
                return
        self._wait_live(deadline)

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            match = _STARTED.search(line)
            if match and self.port is None:
                self.port = int(match.group(1))
                self._started.set()
        self.proc.stdout.close()

    def _wait_live(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            try:
                if self.request("GET", "/v2/health/live")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)

    @property
    def log(self) -> str:
        return "".join(self.lines)

    @property
    def url(self) -> str:
        return f"127.0.0.1:{self.port}"

    def request(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
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


def start_server(*repositories: Path, args: tuple[str, ...] = (), timeout: float = 60.0) -> ServerProcess:
    """Start a server on ``repositories`` listening on 127.0.0.1 and a free port."""
    argv = [f"--model-repository={repo}" for repo in repositories]
    argv += ["--http-port=0", "--http-address=127.0.0.1", *DEFAULT_ARGS, *args]
    return ServerProcess(argv, timeout)
