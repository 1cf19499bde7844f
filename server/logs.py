"""Log set-up with tritonserver's flags: ``--log-verbose``, ``--log-format``, ``--log-file``,
and ``--log-info``, ``--log-warning``, ``--log-error`` (false leaves that severity out).

Lines start the way Triton's do, so log tooling written for Triton keeps working:
``default`` is ``I1130 06:17:13.123456 4242 name] message`` (severity letter, month and day,
time with microseconds, process id, source), ``ISO8601`` is
``2026-11-30T06:17:13Z I 4242 name] message``. Verbose level 1 adds one line per inference
request (``server.dataplane``) and Tornado's access log; level 0 keeps INFO and above.

The logging extension changes these settings while the server runs (``update``): the
severities, the verbosity and the format, never the file. In the split layout each process
applies the same changes to its own loggers.

An error that can repeat many times a second, as accepting connections does while the process
is out of file descriptors, goes through ``RepeatingError``: one report per interval.
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Mapping
from typing import Any

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


#: This process's log settings, by the logging extension's names (``server.log_settings``).
_current: dict[str, Any] = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}
#: The handler ``configure`` installed: the one ``update`` changes (not a test's own).
_handler: logging.Handler | None = None


def configure(settings: Settings) -> None:
    """Route the root logger to standard error or ``--log-file``, at the verbosity and with
    the severities asked."""
    global _handler
    handler: logging.Handler = (
        logging.FileHandler(settings.log_file, encoding="utf-8")
        if settings.log_file
        else logging.StreamHandler(sys.stderr)
    )
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    _handler = handler
    _current["log_file"] = settings.log_file or ""
    update(
        {
            "log_info": settings.log_info,
            "log_warning": settings.log_warning,
            "log_error": settings.log_error,
            "log_verbose_level": settings.log_verbose,
            "log_format": settings.log_format,
        }
    )


def update(changes: Mapping[str, Any]) -> dict[str, Any]:
    """Apply checked ``changes`` (any of the settings but ``log_file``) to this process's
    loggers; every setting, as they are now."""
    _current.update({key: value for key, value in changes.items() if key != "log_file"})
    verbose = int(_current["log_verbose_level"])
    if _handler is not None:
        _handler.setFormatter(TritonFormatter(str(_current["log_format"])))
        for old in [f for f in _handler.filters if isinstance(f, SeverityFilter)]:
            _handler.removeFilter(old)
        _handler.addFilter(
            SeverityFilter(_current["log_info"], _current["log_warning"], _current["log_error"])
        )
    logging.getLogger().setLevel(logging.DEBUG if verbose > 0 else logging.INFO)
    logging.getLogger("tornado.access").setLevel(logging.NOTSET if verbose > 0 else logging.WARNING)
    return dict(_current)


def current() -> dict[str, Any]:
    """Every log setting of this process."""
    return dict(_current)


def verbose_level() -> int:
    """The verbosity now (``--log-verbose``, or as the logging extension last set it)."""
    return int(_current["log_verbose_level"])


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
