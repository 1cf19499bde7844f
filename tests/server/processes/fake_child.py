"""A stand-in for the executor and front-end mains, for the supervisor's tests.

``python -m tests.server.processes.fake_child <argv>``: it does what a child must (see
``server.processes.child``) and records what happens to it, one ``EVENT TIME`` line each, in
``$FAKE_CHILD_DIR/<role><index>.<pid>``. Knobs, from the environment:

- ``FAKE_CHILD_FAIL=<role><index>``: that child exits with status 3 before it is ready;
- ``FAKE_CHILD_LOAD_SECS``: the executor takes this long to get ready (SIGTERM cuts it);
- ``FAKE_CHILD_STOP_SECS``: a front end takes this long to stop after SIGTERM;
- ``FAKE_CHILD_IGNORE_TERM=<role><index>``: that child ignores SIGTERM.

A front end connects to the executor's control socket and, as the real one, is ready only
once the executor has taken the connection and answered (a SIGTERM meanwhile stops it); then
it answers every connection on the inherited HTTP socket with its PID. The executor accepts
on the inherited control socket.
"""

from __future__ import annotations

import os
import select
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from server.processes.child import (
    EXECUTOR,
    ChildInfo,
    child_info,
    die_with_parent,
    ignore_interrupts,
    report_ready,
)


def _record(path: Path, event: str) -> None:
    with path.open("a", encoding="utf-8") as events:
        events.write(f"{event} {time.time():.6f}\n")


def _serve(sock: socket.socket, answer: bytes) -> None:
    """Accept on a socket other processes share (non-blocking): answer, close."""
    while True:
        select.select([sock], [], [], 0.5)
        try:
            connection, _ = sock.accept()
        except BlockingIOError:  # another process took it
            continue
        connection.sendall(answer)
        connection.close()


def _executor_answered(client: socket.socket) -> bool:
    """Until the executor answers on ``client`` (True) or SIGTERM comes (False)."""
    while not select.select([client], [], [], 0.05)[0]:
        if signal.sigtimedwait({signal.SIGTERM}, 0):
            return False
    answer = client.recv(64)
    assert answer == b"executor\n", answer
    return True


def _start_serving(info: ChildInfo, path: Path) -> list[socket.socket] | None:
    """The sockets it serves on; None when a SIGTERM came first."""
    kept: list[socket.socket] = []
    if info.role == EXECUTOR:
        assert info.control_fd is not None and info.http_fd is None
        control = socket.socket(fileno=info.control_fd)
        assert control.family == socket.AF_UNIX
        threading.Thread(target=_serve, args=(control, b"executor\n"), daemon=True).start()
        kept.append(control)
    else:
        assert info.control_fd is None
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.connect(info.control_path)
        kept.append(client)
        _record(path, "waiting")
        if not _executor_answered(client):
            return None
        if info.http_fd is not None:
            http = socket.socket(fileno=info.http_fd)
            answer = f"{os.getpid()}\n".encode()
            threading.Thread(target=_serve, args=(http, answer), daemon=True).start()
            kept.append(http)
    return kept


def main() -> int:
    info = child_info()
    assert info is not None
    die_with_parent()
    ignore_interrupts()
    me = f"{info.role}{info.index}"
    path = Path(os.environ["FAKE_CHILD_DIR"]) / f"{me}.{os.getpid()}"
    _record(path, "start")
    _record(path, f"control_path:{info.control_path}")
    grpc_port = None
    if info.grpc_fd is not None:
        with socket.fromfd(info.grpc_fd, socket.AF_INET, socket.SOCK_STREAM) as grpc:
            grpc_port = grpc.getsockname()[1]
    _record(path, f"grpc_port:{grpc_port}")
    if os.environ.get("FAKE_CHILD_FAIL") == me:
        _record(path, "fail")
        return 3
    ignore_term = os.environ.get("FAKE_CHILD_IGNORE_TERM") == me
    if ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # the threads' too
    if info.role == EXECUTOR and not ignore_term:
        _record(path, "loading")
        # a load cut by SIGTERM: it stops without getting ready
        if signal.sigtimedwait({signal.SIGTERM}, float(os.environ.get("FAKE_CHILD_LOAD_SECS", "0"))):
            _record(path, "sigterm")
            return 0
        _record(path, "loaded")
    kept = _start_serving(info, path)
    if kept is None:
        _record(path, "sigterm")
        _record(path, "exit")
        return 0
    report_ready(info)
    report_ready(info)  # a second time does nothing
    _record(path, "ready")
    if ignore_term:
        time.sleep(60)
        return 4
    signal.sigwait({signal.SIGTERM})
    _record(path, "sigterm")
    if info.role != EXECUTOR:
        time.sleep(float(os.environ.get("FAKE_CHILD_STOP_SECS", "0")))
    _record(path, "exit")
    del kept
    return 0


if __name__ == "__main__":
    sys.exit(main())
