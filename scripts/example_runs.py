"""What the scripts that run NVIDIA's example clients against tensorgate share: start a server
on a repository and wait until its models have loaded, stop it, and run one client.

Used by ``run_python_backend_examples.py`` and ``run_client_examples.py``; not a CI test.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
#: tensorgate's process layouts and the flags that choose them.
LAYOUTS = {"one-process": ["--frontends=0"], "split": []}
START_S = 120.0


@dataclass(frozen=True)
class ClientRun:
    """How one client run ended: passed (exit status 0), its output, and its last line."""

    passed: bool
    output: str
    last: str


def _get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def wait_loaded(server: subprocess.Popen[bytes], http: str) -> str | None:
    """Wait until the server at ``http`` (``host:port``) answers and no model is still
    loading; why not, or None."""
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            return f"server exited with status {server.returncode}"
        try:
            if _get(f"http://{http}/v2/health/ready")[0] == 200:
                return None
            request = urllib.request.Request(
                f"http://{http}/v2/repository/index", data=b"{}", method="POST"
            )
            with urllib.request.urlopen(request, timeout=2) as reply:
                states = [m.get("state") for m in json.loads(reply.read())]
            if states and "LOADING" not in states:
                return None  # some model failed to load: the clients say what that costs
        except (OSError, ValueError):
            pass
        time.sleep(0.25)
    return "server not ready in time"


def tensorgate_command(python: str, repository: Path, layout: str) -> list[str]:
    """The command that serves ``repository`` with this checkout's tensorgate in ``layout``."""
    return [
        python, "-m", "server", f"--model-repository={repository}", "--exit-on-error=false",
        *LAYOUTS[layout],
    ]


def free_ports(count: int) -> list[int]:
    """``count`` ports of 127.0.0.1 that nothing listens on now."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


@contextmanager
def serving(command: Sequence[str], http: str, log_path: Path) -> Iterator[str | None]:
    """Run the server ``command`` (its output into ``log_path``) until the block ends; the
    block gets None once its models have loaded, or why the server is not there."""
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT), PYTHONUNBUFFERED="1")
    with log_path.open("wb") as log:
        server = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        yield wait_loaded(server, http)
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


def run_client(
    command: Sequence[str],
    cwd: Path,
    log_path: Path,
    timeout_s: float,
    env: dict[str, str] | None = None,
) -> ClientRun:
    """Run one client to its end (its output also into ``log_path``)."""
    try:
        done = subprocess.run(
            list(command), capture_output=True, timeout=timeout_s, cwd=cwd, check=False, env=env
        )
    except subprocess.TimeoutExpired:
        return ClientRun(False, "", f"client ran over {timeout_s:.0f} s")
    output = (done.stdout + done.stderr).decode(errors="replace")
    log_path.write_text(output)
    lines = [line for line in output.splitlines() if line.strip()]
    return ClientRun(
        done.returncode == 0, output, lines[-1] if lines else f"exit {done.returncode}"
    )


def importable(python: str, module: str) -> bool:
    """Whether ``python`` can import ``module``."""
    return subprocess.run(
        [python, "-c", f"import {module}"], capture_output=True, check=False
    ).returncode == 0
