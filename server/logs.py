"""Log set-up with tritonserver's flags: ``--log-verbose``, ``--log-format``, ``--log-file``,
and ``--log-info``, ``--log-warning``, ``--log-error`` (false leaves that severity out).

Lines start the way Triton's do, so log tooling written for Triton keeps working:
``default`` is ``I1130 06:17:13.123456 4242 name] message`` (severity letter, month and day,
time with microseconds, process id, source), ``ISO8601`` is
``2026-11-30T06:17:13Z I 4242 name] message``. Verbose level 1 adds one line per inference
request (``server.dataplane``) and Tornado's access log; level 0 keeps INFO and above.

An error that can repeat many times a second, as accepting connections does while the process
is out of file descriptors, goes through ``RepeatingError``: one report per interval.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable

from server.settings import Settings


class TritonFormatter(logging.Formatter):
    """``default`` or ``ISO8601`` prefixes; tracebacks as the standard formatter adds them."""

    def __init__(self, style: str) -> None:
        super().__init__()
        self._iso = style == "ISO8601"

    def format(self, record: logging.LogRecord) -> str:
        letter = record.levelname[:1]
        if self._iso:
            stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(record.created))
            prefix = f"{stamp} {letter} {record.process} {record.name}]"
        else:
            local = time.localtime(record.created)
            micros = int((record.created % 1) * 1_000_000)
            stamp = time.strftime("%m%d %H:%M:%S", local)
            prefix = f"{letter}{stamp}.{micros:06d} {record.process} {record.name}]"
        # A client's strings end up in messages: one record, one line (no forged lines).
        message = record.getMessage().replace("\r", "\\r").replace("\n", "\\n")
        text = f"{prefix} {message}"
        if record.exc_info:
            text += "\n" + self.formatException(record.exc_info)
        return text


class SeverityFilter(logging.Filter):
    """Drops the severities turned off: info, warning, error (with critical, which Triton
    does not have). Verbose (debug) messages follow ``--log-verbose`` alone, as in Triton."""

    def __init__(self, info: bool, warning: bool, error: bool) -> None:
        super().__init__()
        self._off = {
            level
            for level, enabled in (
                (logging.INFO, info),
                (logging.WARNING, warning),
                (logging.ERROR, error),
                (logging.CRITICAL, error),
            )
            if not enabled
        }

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno not in self._off


def configure(settings: Settings) -> None:
    """Route the root logger to standard error or ``--log-file``, at the verbosity and with
    the severities asked."""
    handler: logging.Handler = (
        logging.FileHandler(settings.log_file, encoding="utf-8")
        if settings.log_file
        else logging.StreamHandler(sys.stderr)
    )
    handler.setFormatter(TritonFormatter(settings.log_format))
    handler.addFilter(SeverityFilter(settings.log_info, settings.log_warning, settings.log_error))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if settings.log_verbose > 0 else logging.INFO)
    if settings.log_verbose == 0:
        logging.getLogger("tornado.access").setLevel(logging.WARNING)


class RepeatingError:
    """Logs an error at most once per ``interval_secs``, with the count of repeats not logged
    since the previous report (and its traceback, with ``traceback``)."""

    def __init__(
        self,
        logger: logging.Logger,
        what: str,
        traceback: bool = False,
        interval_secs: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._what = what
        self._traceback = traceback
        self._interval = interval_secs
        self._clock = clock
        self._logged_at: float | None = None
        self._unlogged = 0

    def report(self, error: BaseException) -> None:
        now = self._clock()
        if self._logged_at is not None and now - self._logged_at < self._interval:
            self._unlogged += 1
            return
        repeats = (
            f" ({self._unlogged} more in the last {now - self._logged_at:.0f} s)"
            if self._logged_at is not None and self._unlogged
            else ""
        )
        self._logger.error(
            "%s: %s%s", self._what, error, repeats, exc_info=error if self._traceback else None
        )
        self._logged_at, self._unlogged = now, 0
