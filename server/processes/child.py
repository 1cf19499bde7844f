"""What a child of the supervisor (the executor, a front end) is told, and its duties at start.

The supervisor starts each child as a fresh interpreter (``python -m server.processes.<role>``
with the supervisor's own command line) and describes it in the environment variable
``TENSORGATE_CHILD``, a JSON object: its role and number, the sockets it inherits (by file
descriptor), the gRPC port to share, and the write end of a pipe on which it says when it is
ready. A child's main, first thing:

    info = child_info()          # None: not started by a supervisor
    die_with_parent()            # gone with the supervisor, whatever kills it
    ignore_interrupts()          # Ctrl-C reaches the supervisor, which stops children in order
    use_batch_policy()           # a process it wakes does not preempt it (``cpu_policy``)
    ...                          # load models / start serving
    report_ready(info)

and on SIGTERM it stops in order and exits 0 (see ``server.processes.supervisor``).
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from server import logs
from server.cli import parse_settings
from server.processes.cpu_policy import use_batch_policy
from server.settings import Settings

ENV = "TENSORGATE_CHILD"
EXECUTOR = "executor"
FRONTEND = "frontend"
READY = b"ready\n"

_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_SUPERVISOR_PID = "supervisor_pid"  # in the JSON only: checked by ``die_with_parent``


@dataclass(frozen=True)
class ChildInfo:
    """One child's part in the server."""

    role: str  # "executor" | "frontend"
    index: int  # front-end number 0..N-1 (0 for the executor)
    control_path: str  # filesystem path of the executor's listening AF_UNIX socket
    control_fd: int | None  # executor only: the inherited listening AF_UNIX socket
    http_fd: int | None  # front end only: the inherited listening TCP socket (None: HTTP off)
    grpc_fd: int | None  # front end only: the inherited listening gRPC socket (None: gRPC off)
    frontends: int  # N
    status_fd: int  # write end of a pipe to the supervisor

    def to_env(self, supervisor_pid: int) -> str:
        """The ``TENSORGATE_CHILD`` value describing this child of ``supervisor_pid``."""
        return json.dumps({**asdict(self), _SUPERVISOR_PID: supervisor_pid})


def _environment() -> dict[str, object] | None:
    text = os.environ.get(ENV)
    if text is None:
        return None
    data = json.loads(text)
    if not isinstance(data, dict):
        raise TypeError(f"{ENV} is not a JSON object")
    return data


def child_info() -> ChildInfo | None:
    """This process's part, from ``TENSORGATE_CHILD``; None when no supervisor started it."""
    data = _environment()
    if data is None:
        return None
    role = data.get("role")
    control_path = data.get("control_path")
    if not isinstance(role, str) or not isinstance(control_path, str):
        raise TypeError(f"{ENV}: role or control_path is not a string")
    return ChildInfo(
        role=role,
        index=_number(data, "index"),
        control_path=control_path,
        control_fd=_optional_number(data, "control_fd"),
        http_fd=_optional_number(data, "http_fd"),
        grpc_fd=_optional_number(data, "grpc_fd"),
        frontends=_number(data, "frontends"),
        status_fd=_number(data, "status_fd"),
    )


def _optional_number(data: dict[str, object], key: str) -> int | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{ENV}: {key} is not a number")
    return value


def _number(data: dict[str, object], key: str) -> int:
    value = _optional_number(data, key)
    if value is None:
        raise ValueError(f"{ENV} lacks {key}")
    return value


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent (the supervisor) ends, however it
    ends; and exit at once if the supervisor is already gone (it died before this call: the
    process now has another parent). Call it first thing, from the main thread (the kernel
    ties the setting to the parent thread, and the supervisor starts children from its main
    thread)."""
    libc = ctypes.CDLL(None, use_errno=True)
    prctl = libc.prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl.restype = ctypes.c_int
    if prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"prctl(PR_SET_PDEATHSIG): {os.strerror(error)}")
    data = _environment()
    expected = data.get(_SUPERVISOR_PID) if data is not None else None
    if isinstance(expected, int) and os.getppid() != expected:
        os._exit(1)  # orphaned before the setting took hold; nobody waits for this process


def ignore_interrupts() -> None:
    """Ignore SIGINT: Ctrl-C in a terminal reaches the whole process group, and the supervisor
    forwards the stop in order (front ends first). The children's own ``Shutdown`` handles
    SIGTERM only, so it leaves this in place."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def report_ready(info: ChildInfo) -> None:
    """Tell the supervisor this child is ready (models loaded / serving). Once: the pipe is
    closed after it; a second call does nothing."""
    if info.status_fd in _reported:
        return
    _reported.add(info.status_fd)
    try:
        os.write(info.status_fd, READY)
    finally:
        os.close(info.status_fd)


_reported: set[int] = set()


def begin(role: str, argv: Sequence[str]) -> tuple[ChildInfo, Settings]:
    """What every child does first: check it was started as ``role`` by a supervisor (else
    exit 2), die with it, leave Ctrl-C to it, read the same flags it was given, and take the
    batch CPU policy (before its threads start, so that they inherit it)."""
    info = child_info()
    if info is None or info.role != role:
        print(f"the {role} process is started by the tensorgate supervisor", file=sys.stderr)
        raise SystemExit(2)
    die_with_parent()
    ignore_interrupts()
    settings = parse_settings(argv)
    logs.configure(settings)
    use_batch_policy()
    return info, settings
