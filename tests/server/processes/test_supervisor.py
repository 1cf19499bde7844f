"""The supervisor with stand-in children (``fake_child``): the start order and the ``Started``
lines, restarts of a front end, the end of the server with its executor, the stop order on
SIGTERM, a second signal, a failed start, and no child ever outliving the supervisor."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Protocol, cast

import pytest

from server.processes.supervisor import KILL_SLACK_SECS, SECOND_SIGNAL_STATUS
from server.shutdown import GRACE_SECS
from tests.server_process import ROOT

RUNNER = "tests.server.processes.run_supervisor"
FAKE = "tests.server.processes.fake_child"
EXIT_TIMEOUT = 1


def _alive(pid: int) -> bool:
    """Whether ``pid`` is still one of our stand-ins (a zombie nobody reaped is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] != "Z" and FAKE.encode() in cmdline


def _wait_until(condition: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.02)


class Supervised:
    """The supervisor running fake children; what they recorded, what it logged."""

    def __init__(self, folder: Path, args: tuple[str, ...], env: dict[str, str]) -> None:
        self.folder = folder
        folder.mkdir()
        argv = [
            "--model-repository=unused", "--frontends=2",
            "--http-address=127.0.0.1", "--http-port=0",
            "--grpc-address=127.0.0.1", "--grpc-port=0",
            f"--exit-timeout-secs={EXIT_TIMEOUT}", *args,
        ]
        self.lines: list[str] = []
        self.proc = subprocess.Popen(
            [sys.executable, "-m", RUNNER, *argv],
            cwd=ROOT,
            env={
                **os.environ, "PYTHONUNBUFFERED": "1", "FAKE_CHILD_DIR": str(folder),
                # the control socket's folder: inside the test's, also when a kill leaves it
                "TMPDIR": str(folder.parent), **env,
            },
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
        self.proc.stdout.close()

    @property
    def log(self) -> str:
        return "".join(self.lines)

    def wait_for_log(self, text: str, timeout: float = 10.0) -> None:
        _wait_until(lambda: text in self.log, f"{text!r} not logged:\n{self.log}", timeout)

    def started(self) -> None:
        self.wait_for_log("Started GRPCInferenceService at")

    def events(self, child: str, pid: int) -> dict[str, float]:
        """What process ``pid`` of ``child`` ("executor0", "frontend1") recorded, by event."""
        recorded: dict[str, float] = {}
        for line in (self.folder / f"{child}.{pid}").read_text().splitlines():
            event, _, stamp = line.rpartition(" ")
            recorded[event] = float(stamp)
        return recorded

    def recorded(self, child: str, pid: int, key: str) -> str:
        """The ``key:value`` process ``pid`` of ``child`` recorded: its value."""
        for event in self.events(child, pid):
            if event.startswith(key + ":"):
                return event.partition(":")[2]
        raise AssertionError((child, pid, key))

    def pids(self, child: str) -> list[int]:
        """Every process of ``child`` so far, oldest first."""
        started = {}
        for path in self.folder.glob(f"{child}.*"):
            pid = int(path.suffix[1:])
            events = self.events(child, pid)
            if "start" in events:  # (the file may be there before its first line)
                started[pid] = events["start"]
        return sorted(started, key=started.__getitem__)

    def all_pids(self) -> list[int]:
        return [int(path.suffix[1:]) for path in self.folder.iterdir()]

    def port(self, service: str) -> int:
        for line in self.lines:
            if f"Started {service} at 127.0.0.1:" in line:
                return int(line.rpartition(":")[2])
        raise AssertionError(self.log)

    def wait_exit(self, timeout: float = 10.0) -> int:
        returncode = self.proc.wait(timeout)
        self._reader.join(2)
        return returncode

    def assert_no_child_left(self) -> None:
        left = [pid for pid in self.all_pids() if _alive(pid)]
        assert not left, (left, self.log)

    def clean_up(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pid in self.all_pids():
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        self._reader.join(2)


class Start(Protocol):
    def __call__(self, *args: str, **env: str) -> Supervised: ...


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Start]:
    started: list[Supervised] = []

    def launch(*args: str, **env: str) -> Supervised:
        supervised = Supervised(tmp_path / f"run{len(started)}", args, env)
        started.append(supervised)
        return supervised

    yield launch
    for supervised in started:
        supervised.clean_up()


def _waiting(server: Supervised, child: str) -> bool:
    """Whether ``child``'s process waits for the executor to take its connection."""
    pids = server.pids(child)
    return bool(pids) and "waiting" in server.events(child, pids[0])


def _http_answer(port: int) -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=4) as connection:
        return connection.makefile().readline().strip()


def test_every_child_starts_at_once_and_the_started_lines_follow_their_readiness(
    start: Start,
) -> None:
    server = start(FAKE_CHILD_LOAD_SECS="1.5")
    server.started()
    [executor] = server.pids("executor0")
    fronts = [pid for index in (0, 1) for pid in server.pids(f"frontend{index}")]
    assert len(fronts) == 2
    loaded = server.events("executor0", executor)["loaded"]
    for index, pid in enumerate(fronts):
        # started while the executor loaded; ready once it took their connections
        events = server.events(f"frontend{index}", pid)
        assert events["start"] < loaded < events["ready"]
    http_port, grpc_port = server.port("HTTPService"), server.port("GRPCInferenceService")
    assert http_port > 0 and grpc_port > 0
    started_at = server.log.index("Started HTTPService")
    for index in (0, 1):
        assert server.log.index(f"front end {index} (pid") < started_at
        assert server.recorded(f"frontend{index}", fronts[index], "grpc_port") == str(grpc_port)
    assert server.recorded("executor0", executor, "grpc_port") == "None"
    assert int(_http_answer(http_port)) in fronts  # front ends accept on the shared socket
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0, server.log
    server.assert_no_child_left()


def test_only_the_endpoints_that_are_on_are_logged(start: Start) -> None:
    server = start("--allow-grpc=false", "--frontends=1")
    server.wait_for_log("Started HTTPService at")
    server.wait_for_log("front end 0 (pid")
    [front] = server.pids("frontend0")
    assert server.recorded("frontend0", front, "grpc_port") == "None"
    server.proc.send_signal(signal.SIGINT)
    assert server.wait_exit() == 0, server.log
    assert "GRPCInferenceService" not in server.log


def test_a_front_end_that_dies_is_started_again(start: Start) -> None:
    server = start()
    server.started()
    [old] = server.pids("frontend1")
    os.kill(old, signal.SIGKILL)
    server.wait_for_log(f"front end 1 (pid {old}) ended (killed by SIGKILL)")
    _wait_until(lambda: len(server.pids("frontend1")) == 2, server.log)
    new = server.pids("frontend1")[1]
    server.wait_for_log(f"front end 1 (pid {new}) ready")
    assert "ready" in server.events("frontend1", new)
    assert len(server.pids("frontend0")) == 1 and len(server.pids("executor0")) == 1
    assert server.proc.poll() is None
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0, server.log
    server.assert_no_child_left()


def test_a_front_end_dying_again_and_again_waits_longer_each_time(start: Start) -> None:
    server = start("--frontends=1")
    server.started()
    for attempt in range(3):
        _wait_until(
            cast(Callable[[], bool], lambda n=attempt: len(server.pids("frontend0")) == n + 1),
            server.log,
        )
        pid = server.pids("frontend0")[attempt]
        _wait_until(
            cast(Callable[[], bool], lambda p=pid: "ready" in server.events("frontend0", p)),
            server.log,
        )
        os.kill(pid, signal.SIGKILL)
        server.wait_for_log(f"front end 0 (pid {pid}) ended")
    for delay in ("0.1", "0.2", "0.4"):
        assert f"starting it again in {delay} s" in server.log
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0, server.log
    server.assert_no_child_left()


def test_the_executor_dying_ends_the_server_with_status_1(start: Start) -> None:
    server = start()
    server.started()
    [executor] = server.pids("executor0")
    os.kill(executor, signal.SIGKILL)
    assert server.wait_exit() == 1, server.log
    assert f"the executor (pid {executor}) ended (killed by SIGKILL)" in server.log
    for index in (0, 1):
        [pid] = server.pids(f"frontend{index}")
        assert "exit" in server.events(f"frontend{index}", pid)  # stopped by SIGTERM
    server.assert_no_child_left()


def test_sigterm_stops_the_front_ends_before_the_executor(start: Start) -> None:
    server = start(FAKE_CHILD_STOP_SECS="0.3")
    server.started()
    [executor] = server.pids("executor0")
    control_path = Path(server.recorded("executor0", executor, "control_path"))
    assert control_path.exists()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0, server.log
    executor_stop = server.events("executor0", executor)["sigterm"]
    for index in (0, 1):
        [pid] = server.pids(f"frontend{index}")
        events = server.events(f"frontend{index}", pid)
        assert events["sigterm"] < events["exit"] < executor_stop
    assert "exit" in server.events("executor0", executor)
    server.assert_no_child_left()
    assert not control_path.parent.exists()  # the private folder is removed


def test_a_front_end_that_does_not_stop_is_killed_after_the_exit_timeout(start: Start) -> None:
    server = start("--exit-timeout-secs=0", FAKE_CHILD_IGNORE_TERM="frontend0")
    server.started()
    [stuck] = server.pids("frontend0")
    began, began_wall = time.monotonic(), time.time()
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0, server.log
    # Killed at its deadline (timeout 0 + the grace + the slack), neither sooner nor much later.
    deadline = GRACE_SECS + KILL_SLACK_SECS
    assert deadline <= time.monotonic() - began < deadline + 2.0
    assert f"front end 0 (pid {stuck}) did not stop in time: killing it" in server.log
    [executor] = server.pids("executor0")
    # The executor was told to stop only at that deadline: the front ends go first.
    events = server.events("executor0", executor)
    assert "exit" in events and events["sigterm"] >= began_wall + deadline - 0.05
    server.assert_no_child_left()


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT])
def test_a_second_signal_kills_every_child_at_once(start: Start, second: int) -> None:
    server = start("--exit-timeout-secs=60", FAKE_CHILD_IGNORE_TERM="frontend1")
    server.started()
    server.proc.send_signal(signal.SIGTERM)
    server.wait_for_log("SIGTERM: stopping the front ends")
    _wait_until(lambda: "exit" in server.events("frontend0", server.pids("frontend0")[0]), "f0")
    began = time.monotonic()
    server.proc.send_signal(second)
    assert server.wait_exit() == SECOND_SIGNAL_STATUS, server.log
    assert time.monotonic() - began < 1.0
    assert f"{signal.Signals(second).name} again: exiting now" in server.log
    server.assert_no_child_left()


@pytest.mark.parametrize("failing", ["executor0", "frontend1"])
def test_a_child_that_fails_at_start_up_stops_everything(start: Start, failing: str) -> None:
    server = start(FAKE_CHILD_FAIL=failing)
    assert server.wait_exit() == 1, server.log
    [pid] = server.pids(failing)
    name = "executor" if failing == "executor0" else "front end 1"
    assert f"error: {name} (pid {pid}) ended during start-up (exit status 3)" in server.log
    assert "Started HTTPService" not in server.log
    server.assert_no_child_left()


def test_a_signal_during_the_executor_start_up_stops_it(start: Start) -> None:
    server = start(FAKE_CHILD_LOAD_SECS="30")
    _wait_until(lambda: len(server.pids("executor0")) == 1, server.log)
    [executor] = server.pids("executor0")
    _wait_until(lambda: "loading" in server.events("executor0", executor), server.log)
    for index in (0, 1):  # started beside it, they wait for it to take their connections
        _wait_until(
            cast(Callable[[], bool], lambda i=index: _waiting(server, f"frontend{i}")),
            server.log,
        )
    server.proc.send_signal(signal.SIGTERM)
    assert server.wait_exit() == 0, server.log
    assert "sigterm" in server.events("executor0", executor)
    for index in (0, 1):  # stopped before it
        [pid] = server.pids(f"frontend{index}")
        assert server.events(f"frontend{index}", pid)["exit"] < server.events(
            "executor0", executor
        )["sigterm"]
    assert "Started" not in server.log
    server.assert_no_child_left()


def test_children_die_with_the_supervisor(start: Start) -> None:
    server = start()
    server.started()
    pids = server.all_pids()
    assert len(pids) == 3 and all(_alive(pid) for pid in pids)
    server.proc.kill()
    server.proc.wait()
    _wait_until(lambda: not any(_alive(pid) for pid in pids), "children outlived the supervisor")


def test_a_port_in_use_is_a_clean_start_up_error(start: Start) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = start(f"--http-port={taken.getsockname()[1]}")
        assert server.wait_exit() == 1, server.log
    assert "error:" in server.log and "Traceback" not in server.log
    assert not server.all_pids()


def test_the_supervisor_imports_no_heavy_module() -> None:
    code = (
        "import sys, server.main, server.processes.supervisor;"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'grpc', 'cupy', 'onnxruntime', 'tornado', 'numpy', 'backends'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
        timeout=30,
    )
    assert result.stdout.strip() == "[]", result.stdout


def test_a_port_is_never_shared_with_another_holder() -> None:
    """One SO_REUSEPORT listening socket per front end, all on one port (HTTP's and gRPC's);
    a port another holder has (with SO_REUSEPORT, or these very sockets) is refused, not
    joined."""
    from server.processes.supervisor import _listen_tcp

    group = _listen_tcp("127.0.0.1", 0, 3)
    try:
        ports = {sock.getsockname()[1] for sock in group}
        assert len(group) == 3 and len(ports) == 1
        with pytest.raises(OSError):
            _listen_tcp("127.0.0.1", ports.pop(), 2)
    finally:
        for sock in group:
            sock.close()
