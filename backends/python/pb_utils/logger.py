"""``Logger``: a python model's log lines, written into the server's log.

They follow the server's log flags: info, warning and error lines go out unless
``--log-info``/``--log-warning``/``--log-error`` turn them off, verbose lines only with
``--log-verbose`` of 1 or more (they are debug records). Each record names the model file's
line that logged it.
"""

from __future__ import annotations

import enum
import logging

log = logging.getLogger("triton_python_backend_utils")


class LogLevel(enum.IntEnum):  # also Logger.LogLevel
    """The levels ``Logger.log`` takes, as Python logging levels."""

    INFO = logging.INFO
    WARNING = logging.WARNING
    ERROR = logging.ERROR
    VERBOSE = logging.DEBUG


class Logger:
    """Used as the class itself: ``pb_utils.Logger.log_info("...")``."""

    INFO = LogLevel.INFO
    WARNING = LogLevel.WARNING
    ERROR = LogLevel.ERROR
    VERBOSE = LogLevel.VERBOSE

    @staticmethod
    def log(message: str, level: LogLevel = LogLevel.INFO) -> None:
        log.log(int(level), "%s", message, stacklevel=2)

    @staticmethod
    def log_info(message: str) -> None:
        log.info("%s", message, stacklevel=2)

    @staticmethod
    def log_warn(message: str) -> None:
        log.warning("%s", message, stacklevel=2)

    @staticmethod
    def log_error(message: str) -> None:
        log.error("%s", message, stacklevel=2)

    @staticmethod
    def log_verbose(message: str) -> None:
        log.debug("%s", message, stacklevel=2)
