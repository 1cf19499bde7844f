"""What a child learns from ``TENSORGATE_CHILD``, and its duties: dying with the supervisor,
ignoring Ctrl-C, saying once that it is ready."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from server.processes import child
from server.processes.child import ENV, ChildInfo, child_info, report_ready
from tests.server_process import ROOT

INFO = ChildInfo(
    role="frontend", index=1, control_path="/run/x/control", control_fd=None, http_fd=5,
    grpc_fd=9, frontends=2, status_fd=7,
)


def test_not_a_child_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert child_info() is None


def test_the_variable_round_trips(monkeypatch: pytest.MonkeyPatch) -> None:
    text = INFO.to_env(supervisor_pid=1234)
    assert json.loads(text)["supervisor_pid"] == 1234
    monkeypatch.setenv(ENV, text)
    assert child_info() == INFO


@pytest.mark.parametrize(
    "text", ['[1]', '{"role": "frontend"}', '{"role": 1, "control_path": "x"}'],
)
def test_a_malformed_variable_is_refused(monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    monkeypatch.setenv(ENV, text)
    with pytest.raises((TypeError, ValueError)):
        child_info()


def test_report_ready_writes_once_and_closes_the_pipe(monkeypatch: pytest.MonkeyPatch) -> None:
    read_fd, write_fd = os.pipe()
    info = ChildInfo("executor", 0, "/x", 3, None, None, 1, write_fd)
    monkeypatch.setattr(child, "_reported", set())
    report_ready(info)
    report_ready(info)
    with os.fdopen(read_fd, "rb") as pipe:
        assert pipe.read() == b"ready\n"  # end of file: the write end is closed


_PROBE = """
import ctypes, os, signal, sys
from server.processes.child import die_with_parent, ignore_interrupts
die_with_parent()
ignore_interrupts()
value = ctypes.c_int()
ctypes.CDLL(None).prctl(2, ctypes.byref(value), 0, 0, 0)  # PR_GET_PDEATHSIG
print(value.value, signal.getsignal(signal.SIGINT) == signal.SIG_IGN)
"""


def _probe(supervisor_pid: int) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, ENV: INFO.to_env(supervisor_pid)}
    return subprocess.run(
        [sys.executable, "-c", _PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=30, check=False,
    )


def test_a_child_dies_with_its_parent_and_ignores_interrupts() -> None:
    result = _probe(os.getpid())
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == [str(int(signal.SIGKILL)), "True"]


def test_a_child_whose_supervisor_is_already_gone_exits() -> None:
    result = _probe(os.getpid() + 1_000_000)  # not its parent: the supervisor died already
    assert result.returncode == 1 and result.stdout == "", result
