"""The ``tensorgate`` command with front ends: starts one executor and N front ends, keeps them
running, and stops them in order.

It serves nothing and imports neither grpc, CuPy, ONNX Runtime nor Tornado: children start as
fresh interpreters (``python -m <module> <the same command line>``), never forked from a
process holding a CUDA context or grpc's threads. What it owns:

- the sockets the children serve on: one HTTP listening socket per front end, all on one port
  with ``SO_REUSEPORT`` (bound and listening here; front end ``i`` accepts on the ``i``-th,
  also after a restart), the gRPC port (reserved by a bound, not listening ``SO_REUSEPORT``
  socket, so port 0 becomes a real port; each front end binds it with ``SO_REUSEPORT``) and
  the executor's control socket (``AF_UNIX``, listening, in a private temporary folder; the
  executor inherits it, front ends connect to its path). With one listening socket shared by
  every front end, the first front end to wake took every connection of a burst: perf_analyzer's
  8 connections all went to one front end in most runs, and on a host with more cores the
  others idled. The kernel spreads connections among ``SO_REUSEPORT`` sockets by their
  addresses and ports; connections to a front end being restarted wait in its socket's
  backlog meanwhile;
- the start: every child at once. A front end's own start (its imports, its arena) takes
  about as long as the executor's imports and loads, so they overlap; on a host with spare
  cores the front ends' start is hidden. On 2 cores, where the three compete, a server on the
  example models was ready in 2.0 s (median of 8) against 2.4 s with the front ends started
  after the executor was ready. A front end connects to the control socket, listening from
  the outset, and waits there until the executor, its models loaded, takes the connection.
  When every child has said it is ready the supervisor logs ``Started HTTPService at
  ADDR:PORT`` and ``Started GRPCInferenceService at ADDR:PORT``. A child that exits before it
  is ready fails the start: everything stops, exit status 1;
- restarts: a front end that dies is started again on the same sockets (after 0.1 s, doubling
  to 5 s while it keeps dying young). The executor dying ends the server (the documented
  choice): the front ends have already answered their pending requests 503 / UNAVAILABLE; they
  are stopped and the exit status is 1;
- the stop: on SIGTERM or SIGINT the front ends stop first (no new connections, in-flight
  requests finish within ``--exit-timeout-secs``), then the executor; exit status 0. Whatever
  is still running past the timeout (plus a moment) is killed. A second signal kills every
  child at once.

No orphans: each child asks the kernel to kill it when the supervisor dies
(``child.die_with_parent``), and every way out of ``run`` kills and reaps the children left.
"""

from __future__ import annotations

import logging
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from types import FrameType

from server.processes.child import ENV, EXECUTOR, FRONTEND, READY, ChildInfo
from server.settings import Settings
from server.shutdown import GRACE_SECS

log = logging.getLogger("server")

#: The children's ``python -m`` modules: the executor's, the front end's.
CHILD_MODULES = ("server.processes.executor", "server.processes.frontend")
#: A front end that died is started again after this, doubling up to ``RESTART_MAX_SECS`` while
#: it keeps dying within ``RESTART_STEADY_SECS`` of its start.
RESTART_FIRST_SECS = 0.1
RESTART_MAX_SECS = 5.0
RESTART_STEADY_SECS = 10.0
#: Past a child's own exit deadline (``--exit-timeout-secs`` plus the grace its watchdog
#: allows), how long it has before it is killed.
KILL_SLACK_SECS = 0.5
#: The exit status after a second stop signal. 0, as in the one-process server
#: (``server.shutdown``): the stop was asked for; the log says what was cut.
SECOND_SIGNAL_STATUS = 0
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_UNIX_PATH_ROOM = 100  # an AF_UNIX socket path holds 107 bytes; "/control" takes 8


def run(
    settings: Settings,
    argv: Sequence[str],
    *,
    child_modules: tuple[str, str] = CHILD_MODULES,
) -> int:
    """Run the server as processes until a stop; the exit status. ``argv`` is the command line
    (without the program name) every child gets; ``child_modules`` the executor's and the
    front end's module. Call it from the main thread, logging configured."""
    frontends = settings.frontend_count()
    if frontends < 1:
        raise ValueError("the supervisor needs at least one front end")
    try:
        sockets = _Sockets(settings, frontends)
    except OSError as exc:  # a port in use, an address not ours
        log.error("error: %s", exc)
        return 1
    try:
        supervisor = _Supervisor(settings, list(argv), child_modules, frontends, sockets)
        try:
            return supervisor.run()
        finally:
            supervisor.close()
    finally:
        sockets.close()


class _Sockets:
    """The sockets the children share, and the private folder of the control socket."""

    def __init__(self, settings: Settings, frontends: int) -> None:
        self.http: list[socket.socket] = []  # one per front end
        self.grpc: list[socket.socket] = []  # one per front end
        self.control: socket.socket | None = None
        self.folder = tempfile.mkdtemp(prefix="tensorgate-")  # mode 0700: ours alone
        if len(os.fsencode(self.folder)) > _UNIX_PATH_ROOM:  # $TMPDIR too deep for a socket
            os.rmdir(self.folder)
            self.folder = tempfile.mkdtemp(prefix="tensorgate-", dir="/tmp")
        self.control_path = os.path.join(self.folder, "control")
        try:
            if settings.allow_http:
                self.http = _listen_tcp(settings.http_address, settings.http_port, frontends)
            if settings.allow_grpc:
                self.grpc = _listen_tcp(settings.grpc_address, settings.grpc_port, frontends)
            self.control = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.control.bind(self.control_path)
            self.control.listen(socket.SOMAXCONN)
        except BaseException:
            self.close()
            raise

    @property
    def http_port(self) -> int | None:
        return int(self.http[0].getsockname()[1]) if self.http else None

    @property
    def grpc_port(self) -> int | None:
        return int(self.grpc[0].getsockname()[1]) if self.grpc else None

    def close_listeners(self) -> None:
        """Our copies of the HTTP and gRPC listening sockets."""
        for sock in (*self.http, *self.grpc):
            sock.close()

    def close(self) -> None:
        for sock in (*self.http, *self.grpc, self.control):
            if sock is not None:
                sock.close()
        shutil.rmtree(self.folder, ignore_errors=True)


def _tcp_socket(host: str, port: int, *options: int) -> socket.socket:
    """A TCP socket bound to the first address ``host`` names for listening (as Tornado's
    ``bind_sockets`` finds them; "" is every interface), ``options`` set."""
    family, _, _, _, sockaddr = socket.getaddrinfo(
        host or None, port, socket.AF_UNSPEC, socket.SOCK_STREAM, 0, socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        for option in options:
            sock.setsockopt(socket.SOL_SOCKET, option, 1)
        if family == socket.AF_INET6:  # as Tornado does: IPv4 is its own address
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind(sockaddr)
    except BaseException:
        sock.close()
        raise
    return sock


def _listen_tcp(host: str, port: int, count: int) -> list[socket.socket]:
    """``count`` sockets on one port (a free one for port 0), listening, non-blocking, with
    ``SO_REUSEPORT``: one per front end, which accepts on it alone (on a shared socket the
    first front end to wake took every connection of a burst). The port is probed first,
    see ``_probe_port``."""
    chosen = _probe_port(host, port)
    sockets: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = _tcp_socket(host, chosen, socket.SO_REUSEADDR, socket.SO_REUSEPORT)
            sockets.append(sock)
            sock.setblocking(False)
            sock.listen(socket.SOMAXCONN)
    except BaseException:
        for sock in sockets:
            sock.close()
        raise
    return sockets


def _probe_port(host: str, port: int) -> int:
    """``port`` if nothing listens on it (a free port for 0): a plain bind, closed at once.
    ``SO_REUSEPORT`` alone would join a port another process of this user already holds the
    same way (and for port 0 the kernel may pick such a port), and the two servers would
    silently split the traffic. The plain bind fails on any port in use and picks a port
    nothing holds."""
    probe = _tcp_socket(host, port, socket.SO_REUSEADDR)
    chosen = int(probe.getsockname()[1])
    probe.close()
    return chosen


def _status_text(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit status {returncode}"


class _Child:
    """One child process slot: the executor, or front end ``index``, and its current process."""

    def __init__(self, role: str, index: int, module: str) -> None:
        self.role = role
        self.index = index
        self.module = module
        self.proc: subprocess.Popen[bytes] | None = None
        self.status_fd: int | None = None  # read end of its status pipe
        self.status = b""
        self.ready = False
        self.started_at = 0.0
        self.restart_at: float | None = None
        self.restart_delay = 0.0
        self.returncode: int | None = None  # of the last process, once it has exited

    @property
    def name(self) -> str:
        return "executor" if self.role == EXECUTOR else f"front end {self.index}"

    @property
    def running(self) -> bool:
        return self.proc is not None and self.returncode is None

    def describe(self) -> str:
        pid = self.proc.pid if self.proc is not None else 0
        return f"{self.name} (pid {pid})"


class _Stopped(Exception):
    """A second stop signal: every child is killed now."""


class _Supervisor:
    def __init__(
        self,
        settings: Settings,
        argv: list[str],
        modules: tuple[str, str],
        frontends: int,
        sockets: _Sockets,
    ) -> None:
        self._settings = settings
        self._argv = argv
        self._sockets = sockets
        self._executor = _Child(EXECUTOR, 0, modules[0])
        self._frontends = [_Child(FRONTEND, index, modules[1]) for index in range(frontends)]
        self._selector = selectors.DefaultSelector()
        self._signals: list[int] = []
        self._exited: list[_Child] = []  # reaped since the start or serving loop last looked
        self._wakeup_r, self._wakeup_w = os.pipe()
        os.set_blocking(self._wakeup_r, False)
        os.set_blocking(self._wakeup_w, False)
        self._selector.register(self._wakeup_r, selectors.EVENT_READ, None)
        self._old_wakeup = signal.set_wakeup_fd(self._wakeup_w, warn_on_full_buffer=False)
        self._old_handlers: dict[int, object] = {}
        for signum in (*_STOP_SIGNALS, signal.SIGCHLD):
            if signum == signal.SIGINT and signal.getsignal(signum) == signal.SIG_IGN:
                continue  # started in the background with interrupts ignored: keep them so
            self._old_handlers[signum] = signal.signal(signum, self._on_signal)

    # -- the phases ------------------------------------------------------------------------

    def run(self) -> int:
        try:
            return self._run()
        except _Stopped:
            return SECOND_SIGNAL_STATUS

    def _run(self) -> int:
        children = [self._executor, *self._frontends]
        for child in children:
            self._start(child)
        while not all(child.ready for child in children):
            self._pump(None)
            if self._signals:
                return self._stop()
            if self._exited:
                return self._failed_start(self._exited[0])
        if self._sockets.http_port is not None:
            log.info(
                "Started HTTPService at %s:%d", self._settings.http_address, self._sockets.http_port
            )
        if self._sockets.grpc_port is not None:
            log.info(
                "Started GRPCInferenceService at %s:%d",
                self._settings.grpc_address,
                self._sockets.grpc_port,
            )
        return self._serve()

    def _serve(self) -> int:
        """Until a stop signal or the executor's end: restart front ends that die."""
        while True:
            restarts = [c.restart_at for c in self._frontends if c.restart_at is not None]
            self._pump(min(restarts) if restarts else None)
            if self._signals:
                return self._stop()
            exited, self._exited = self._exited, []
            for child in exited:
                if child is self._executor:
                    log.error(
                        "error: the executor (pid %d) ended (%s); stopping the front ends",
                        child.proc.pid if child.proc else 0,
                        _status_text(child.returncode or 0),
                    )
                    self._stop_frontends(time.monotonic())
                    return 1
                self._schedule_restart(child)
            now = time.monotonic()
            for child in self._frontends:
                if child.restart_at is not None and child.restart_at <= now:
                    child.restart_at = None
                    self._start(child)

    def _schedule_restart(self, child: _Child) -> None:
        lived = time.monotonic() - child.started_at
        if lived >= RESTART_STEADY_SECS or child.restart_delay == 0.0:
            child.restart_delay = RESTART_FIRST_SECS
        else:
            child.restart_delay = min(child.restart_delay * 2, RESTART_MAX_SECS)
        child.restart_at = time.monotonic() + child.restart_delay
        log.warning(
            "%s ended (%s) after %.1f s; starting it again in %.1f s",
            child.describe(), _status_text(child.returncode or 0), lived, child.restart_delay,
        )

    def _failed_start(self, child: _Child) -> int:
        log.error(
            "error: %s ended during start-up (%s); stopping",
            child.describe(), _status_text(child.returncode or 0),
        )
        self._stop_all(time.monotonic())
        return 1

    def _stop(self) -> int:
        """The asked-for stop: front ends (they finish what is in flight), then the executor."""
        started = time.monotonic()
        signum = self._signals[0]
        log.info("%s: stopping the front ends, then the executor", signal.Signals(signum).name)
        self._stop_all(started)
        log.info("stopped")
        return 0

    def _stop_all(self, started: float) -> None:
        """Front ends first, then the executor, each killed if still there at its deadline:
        the exit timeout from ``started``, and for the executor at least a moment after the
        front ends are gone."""
        deadline = self._stop_frontends(started)
        self._stop_child(self._executor, max(deadline, time.monotonic() + KILL_SLACK_SECS))

    def _stop_frontends(self, started: float) -> float:
        """SIGTERM every front end and wait until they have exited (killing those still there
        at their deadline); the deadline."""
        # No front end is started again: the listening sockets are theirs alone now, so once
        # each has closed its copy, new connections are refused instead of left waiting.
        self._sockets.close_listeners()
        for child in self._frontends:
            child.restart_at = None
            if child.running:
                self._signal(child, signal.SIGTERM)
        deadline = started + self._settings.exit_timeout_secs + GRACE_SECS + KILL_SLACK_SECS
        self._wait_gone(self._frontends, deadline)
        return deadline

    def _stop_child(self, child: _Child, deadline: float) -> None:
        if child.running:
            self._signal(child, signal.SIGTERM)
        self._wait_gone([child], deadline)

    def _wait_gone(self, children: list[_Child], deadline: float) -> None:
        while any(child.running for child in children):
            if time.monotonic() >= deadline:
                for child in children:
                    if child.running:
                        log.warning("%s did not stop in time: killing it", child.describe())
                        self._signal(child, signal.SIGKILL)
                deadline = float("inf")  # SIGKILL cannot be refused
            self._pump(None if deadline == float("inf") else deadline)

    # -- children --------------------------------------------------------------------------

    def _start(self, child: _Child) -> None:
        read_fd, write_fd = os.pipe()
        sockets = self._sockets
        is_executor = child.role == EXECUTOR
        control_fd = sockets.control.fileno() if is_executor and sockets.control else None
        http_fd = sockets.http[child.index].fileno() if not is_executor and sockets.http else None
        grpc_fd = sockets.grpc[child.index].fileno() if not is_executor and sockets.grpc else None
        info = ChildInfo(
            role=child.role,
            index=child.index,
            control_path=sockets.control_path,
            control_fd=control_fd,
            http_fd=http_fd,
            grpc_fd=grpc_fd,
            frontends=len(self._frontends),
            status_fd=write_fd,
        )
        inherited = [fd for fd in (control_fd, http_fd, grpc_fd, write_fd) if fd is not None]
        try:
            child.proc = subprocess.Popen(
                [sys.executable, "-m", child.module, *self._argv],
                env={**os.environ, ENV: info.to_env(os.getpid())},
                pass_fds=inherited,
                stdin=subprocess.DEVNULL,
            )
        except BaseException:
            os.close(read_fd)
            raise
        finally:
            os.close(write_fd)
        os.set_blocking(read_fd, False)
        child.status_fd, child.status, child.ready = read_fd, b"", False
        child.returncode = None
        child.started_at = time.monotonic()
        self._selector.register(read_fd, selectors.EVENT_READ, child)
        log.info("%s starting", child.describe())

    def _signal(self, child: _Child, signum: int) -> None:
        """Signal the child's process, by its PID, if it has not been reaped (so the PID is
        still its own)."""
        if child.proc is not None and child.returncode is None:
            try:
                child.proc.send_signal(signum)
            except ProcessLookupError:
                pass

    def _read_status(self, child: _Child) -> None:
        if child.status_fd is None:
            return
        try:
            while data := os.read(child.status_fd, 64):
                child.status += data
                if not child.ready and READY in child.status:
                    child.ready = True
                    log.info("%s ready", child.describe())
            self._close_status(child)  # end of file: the pipe is done with
        except BlockingIOError:
            pass

    def _close_status(self, child: _Child) -> None:
        if child.status_fd is not None:
            self._selector.unregister(child.status_fd)
            os.close(child.status_fd)
            child.status_fd = None

    def _reap(self) -> None:
        for child in (self._executor, *self._frontends):
            if child.running and child.proc is not None:
                returncode = child.proc.poll()
                if returncode is not None:
                    self._read_status(child)  # a ready it said before it ended counts
                    self._close_status(child)
                    child.returncode = returncode
                    self._exited.append(child)

    # -- waiting ---------------------------------------------------------------------------

    def _pump(self, until: float | None) -> None:
        """Wait until something happens (a child's status, its end, a signal) or ``until``."""
        timeout = None if until is None else max(0.0, until - time.monotonic())
        for key, _ in self._selector.select(timeout):
            if key.data is None:
                try:
                    while os.read(self._wakeup_r, 512):
                        pass
                except BlockingIOError:
                    pass
            else:
                self._read_status(key.data)
        self._reap()
        if len(self._signals) > 1:
            self._kill_all()
            log.warning("%s again: exiting now", signal.Signals(self._signals[-1]).name)
            raise _Stopped

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if signum in _STOP_SIGNALS:
            self._signals.append(signum)

    def _kill_all(self) -> None:
        for child in (*self._frontends, self._executor):
            self._signal(child, signal.SIGKILL)
        for child in (*self._frontends, self._executor):
            if child.running and child.proc is not None:
                child.returncode = child.proc.wait()
            self._close_status(child)

    def close(self) -> None:
        """Kill and reap whatever child is left; restore the signal handling."""
        self._kill_all()
        for signum, handler in self._old_handlers.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]
        signal.set_wakeup_fd(self._old_wakeup)
        self._selector.close()
        os.close(self._wakeup_r)
        os.close(self._wakeup_w)
