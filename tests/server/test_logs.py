"""Logging flags: Triton-style line prefixes, ``--log-file``, one line per request at
``--log-verbose=1``, ``--log-info/-warning/-error`` leaving severities out, and failed requests
logged with their id at the default verbosity."""

from __future__ import annotations

import json
import logging
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from server import logs
from server.logs import RepeatingError, SeverityFilter, TritonFormatter
from server.settings import Settings
from tests.server.http.helpers import assert_simple_ok
from tests.server_process import EXAMPLES, ROOT, start_server

_DEFAULT = re.compile(r"^I\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ server\.test\] hello 42$")
_ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ W \d+ server\.test\] hello 42$")


def _record(level: int) -> logging.LogRecord:
    return logging.LogRecord("server.test", level, __file__, 1, "hello %d", (42,), None)


def test_prefixes_follow_tritons_formats() -> None:
    assert _DEFAULT.match(TritonFormatter("default").format(_record(logging.INFO)))
    assert _ISO.match(TritonFormatter("ISO8601").format(_record(logging.WARNING)))


def test_tracebacks_are_kept() -> None:
    try:
        raise ValueError("boom")
    except ValueError:
        record = _record(logging.ERROR)
        record.exc_info = sys.exc_info()
    text = TritonFormatter("default").format(record)
    assert text.startswith("E") and "ValueError: boom" in text and "Traceback" in text


def _infer_body(request_id: str, output: str = "OUTPUT0") -> bytes:
    return json.dumps(
        {
            "id": request_id,
            "inputs": [
                {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
                {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
            ],
            "outputs": [{"name": output}],
        }
    ).encode()


def test_failed_requests_are_logged_with_their_id() -> None:
    server = start_server(EXAMPLES)
    try:
        status, _, _ = server.request(
            "POST", "/v2/models/simple/infer", _infer_body("req-7", output="NOPE")
        )
        assert status == 400
        deadline = time.monotonic() + 5
        while "req-7" not in server.log and time.monotonic() < deadline:
            time.sleep(0.05)
        assert "request id 'req-7' to model 'simple' version 1 failed" in server.log
        assert_simple_ok(server)  # the failure left the server serving
        assert "infer model=" not in server.log, "per-request lines need --log-verbose=1"
    finally:
        server.stop()


def test_log_file_with_verbose_request_lines(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    process = subprocess.Popen(
        [
            sys.executable, "-m", "server", f"--model-repository={EXAMPLES}",
            "--http-port=0", "--http-address=127.0.0.1", "--allow-grpc=false",
            "--allow-metrics=false", "--log-verbose=1", "--log-format=ISO8601",
            f"--log-file={log_file}",
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        port = None
        deadline = time.monotonic() + 60
        while port is None:
            assert time.monotonic() < deadline and process.poll() is None, "server did not start"
            match = re.search(r"Started HTTPService at \S+:(\d+)", log_file.read_text()
                              if log_file.exists() else "")
            port = int(match.group(1)) if match else None
            time.sleep(0.05)
        import http.client

        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        connection.request("POST", "/v2/models/simple/infer", _infer_body("req-9"))
        assert connection.getresponse().status == 200
        connection.close()
        deadline = time.monotonic() + 5
        while "id='req-9'" not in log_file.read_text() and time.monotonic() < deadline:
            time.sleep(0.05)
        text = log_file.read_text()
        assert re.search(r"infer model=simple version=1 id='req-9' status=OK duration_us=\d+", text)
        first = text.splitlines()[0]
        assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IDW] \d+ ", first), first
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
    assert process.returncode == 0
    assert "Started HTTPService" not in output, "with --log-file nothing goes to the console"


def test_a_repeating_error_is_reported_once_per_interval(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    errors = RepeatingError(logging.getLogger("server.test"), "accept failed", clock=lambda: now[0])
    error = OSError(24, "Too many open files")
    with caplog.at_level(logging.ERROR, logger="server.test"):
        for step in range(100):  # ten a second for ten seconds
            now[0] = step / 10
            errors.report(error)
    assert [record.getMessage() for record in caplog.records] == [
        "accept failed: [Errno 24] Too many open files",
        "accept failed: [Errno 24] Too many open files (49 more in the last 5 s)",
    ]
    assert all(record.exc_info is None for record in caplog.records)


def test_a_repeating_error_can_carry_its_traceback(caplog: pytest.LogCaptureFixture) -> None:
    errors = RepeatingError(logging.getLogger("server.test"), "sampling failed", traceback=True)
    error = OSError(24, "Too many open files")
    with caplog.at_level(logging.ERROR, logger="server.test"):
        errors.report(error)
        errors.report(error)
    (record,) = caplog.records
    assert record.exc_info is not None and record.exc_info[1] is error


def test_severity_filter_drops_the_severities_turned_off() -> None:
    kept = SeverityFilter(info=False, warning=True, error=False)
    levels = (logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL)
    assert [kept.filter(_record(level)) for level in levels] == [True, False, True, False, False]
    everything = SeverityFilter(info=True, warning=True, error=True)
    assert all(everything.filter(_record(level)) for level in levels)


@pytest.mark.usefixtures("root_logging")
def test_configure_applies_the_severity_flags(tmp_path: Path) -> None:
    log_file = tmp_path / "server.log"
    logs.configure(Settings(log_file=str(log_file), log_verbose=1, log_warning=False))
    test_log = logging.getLogger("server.test")
    test_log.debug("verbose")
    test_log.info("info")
    test_log.warning("warning")
    test_log.error("error")
    letters = [line[0] for line in log_file.read_text().splitlines()]
    assert letters == ["D", "I", "E"]


@pytest.mark.parametrize(
    ("flags", "letters"),
    [
        ((), {"I", "W", "E"}),
        (("--log-info=false",), {"W", "E"}),
        (("--log-warning=false", "--log-error", "false"), {"I"}),
    ],
)
def test_severity_flags_on_a_server_that_fails_to_start(
    tmp_path: Path, flags: tuple[str, ...], letters: set[str]
) -> None:
    """A model that fails to load ends the start (an error), after the warning about
    ``--http-thread-count`` and the info lines; each flag leaves its severity out."""
    broken = tmp_path / "models" / "broken"
    (broken / "1").mkdir(parents=True)
    (broken / "config.pbtxt").write_text("max_batch_size: {{\n")
    result = subprocess.run(
        [
            sys.executable, "-m", "server", f"--model-repository={broken.parent}",
            "--http-port=0", "--http-address=127.0.0.1", "--grpc-port=0",
            "--grpc-address=127.0.0.1", "--allow-metrics=false", "--http-thread-count=4",
            *flags,
        ],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )
    assert result.returncode == 1
    lines = result.stderr.splitlines()
    assert {line[0] for line in lines if re.match(r"[A-Z]\d{4} ", line)} == letters, lines
    assert all(re.match(r"[A-Z]\d{4} ", line) for line in lines), lines


@pytest.mark.usefixtures("root_logging")
def test_update_changes_the_configured_handler_while_running(tmp_path: Path) -> None:
    """The logging extension's changes: format, severities and verbosity, not the file."""
    log_file = tmp_path / "server.log"
    logs.configure(Settings(log_file=str(log_file)))
    assert logs.current() == {
        "log_file": str(log_file), "log_info": True, "log_warning": True, "log_error": True,
        "log_verbose_level": 0, "log_format": "default",
    }
    test_log = logging.getLogger("server.test")
    test_log.debug("hidden")
    now = logs.update({"log_verbose_level": 1, "log_info": False, "log_format": "ISO8601"})
    assert now["log_verbose_level"] == logs.verbose_level() == 1
    assert now["log_file"] == str(log_file)
    test_log.debug("shown")
    test_log.info("left out")
    test_log.warning("kept")
    lines = log_file.read_text().splitlines()
    assert [line.split("] ", 1)[1] for line in lines] == ["shown", "kept"]
    assert all(line[:4].isdigit() and line[19] == "Z" for line in lines), lines
    assert logging.getLogger("tornado.access").getEffectiveLevel() == logging.DEBUG
    logs.update({"log_verbose_level": 0})
    assert logging.getLogger("tornado.access").getEffectiveLevel() == logging.WARNING
