"""One exception hierarchy for the whole server, and the one table that maps it to wire codes.

Domain code raises these; the HTTP and gRPC layers look the status up here and never choose a
code themselves. The categories follow Triton's ``TRITONSERVER_Error`` codes so that clients see
the same HTTP status and gRPC code as from Triton (see triton-facts §1.3).
"""

from __future__ import annotations

import enum
import logging


class ErrorCode(enum.Enum):
    """Transport-neutral error category (Triton's TRITONSERVER_ERROR_* codes)."""

    INVALID_ARG = "INVALID_ARG"
    NOT_FOUND = "NOT_FOUND"
    UNAVAILABLE = "UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    INTERNAL = "INTERNAL"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"
    RESTRICTED = "RESTRICTED"  # not Triton's: its restricted APIs answer outside its codes


# code -> (HTTP status, gRPC StatusCode member name). Names, not grpc objects, so that the
# domain layer does not import grpc.
_WIRE_CODES: dict[ErrorCode, tuple[int, str]] = {
    ErrorCode.INVALID_ARG: (400, "INVALID_ARGUMENT"),
    ErrorCode.NOT_FOUND: (404, "NOT_FOUND"),
    ErrorCode.UNAVAILABLE: (503, "UNAVAILABLE"),
    ErrorCode.UNSUPPORTED: (501, "UNIMPLEMENTED"),
    ErrorCode.INTERNAL: (500, "INTERNAL"),
    ErrorCode.ALREADY_EXISTS: (400, "ALREADY_EXISTS"),
    ErrorCode.CANCELLED: (400, "CANCELLED"),
    ErrorCode.UNKNOWN: (400, "UNKNOWN"),
    ErrorCode.RESTRICTED: (403, "UNAVAILABLE"),
}


class InferenceServerError(Exception):
    """Base of every error the server reports to a client; ``str(err)`` is the client message."""

    code: ErrorCode = ErrorCode.INTERNAL

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def http_status(self) -> int:
        return _WIRE_CODES[self.code][0]

    @property
    def grpc_status_name(self) -> str:
        return _WIRE_CODES[self.code][1]


class InvalidArgument(InferenceServerError):
    """The client sent something malformed or inconsistent with the model (HTTP 400)."""

    code = ErrorCode.INVALID_ARG


class NotFound(InferenceServerError):
    """A named thing that is addressed by version or region does not exist (HTTP 404)."""

    code = ErrorCode.NOT_FOUND


class Unavailable(InferenceServerError):
    """The server cannot take the request now: not ready, queue full, stopping (HTTP 503)."""

    code = ErrorCode.UNAVAILABLE


class Rejected(Unavailable):
    """The scheduler turned the request away: queue full, or its queue timeout expired (HTTP
    503, as any Unavailable). Counted as ``reason="REJECTED"`` in the failure metrics."""


class AlreadyExists(InferenceServerError):
    """The name is taken, e.g. by a registered shared memory region (400, ALREADY_EXISTS)."""

    code = ErrorCode.ALREADY_EXISTS


class Restricted(InferenceServerError):
    """The request is of a restricted API and lacks its header (``server.restricted``): 403
    over HTTP and UNAVAILABLE over gRPC, as Triton answers it."""

    code = ErrorCode.RESTRICTED


class Unsupported(InferenceServerError):
    """The request asks for a feature the server does not offer (HTTP 501)."""

    code = ErrorCode.UNSUPPORTED


class Cancelled(InferenceServerError):
    """The request was cancelled (400, CANCELLED); a python model may answer one so."""

    code = ErrorCode.CANCELLED


class UnknownError(InferenceServerError):
    """An error of no known category (400, UNKNOWN, as Triton maps TRITONSERVER_ERROR_UNKNOWN);
    only a python model's ``TritonError.UNKNOWN`` raises it."""

    code = ErrorCode.UNKNOWN


class InternalError(InferenceServerError):
    """A fault of the server or the model, not of the client (HTTP 500)."""

    code = ErrorCode.INTERNAL


class ModelLoadError(InferenceServerError):
    """A model could not be loaded: bad config, unreadable ONNX file, unsupported backend."""

    code = ErrorCode.INVALID_ARG


def to_server_error(exc: BaseException) -> InferenceServerError:
    """Wrap anything that is not already a server error as an internal error."""
    if isinstance(exc, InferenceServerError):
        return exc
    return InternalError(f"{type(exc).__name__}: {exc}")


def reported(exc: BaseException, log: logging.Logger, where: str) -> InferenceServerError:
    """``exc`` as the error its client is answered with; a server fault (an internal error)
    is also logged, with its traceback, as "internal error <where>: <message>". Client
    mistakes are not logged here: they are answered, and the data plane logs every failure."""
    error = to_server_error(exc)
    if isinstance(error, InternalError):
        log.error("internal error %s: %s", where, error.message, exc_info=exc)
    return error


def failure_reason(error: Exception) -> str:
    """The ``reason`` label of a failed request: turned away by the scheduler, a fault of the
    model or backend, or anything else (bad input, an unloading model)."""
    if isinstance(error, Rejected):
        return "REJECTED"
    if isinstance(error, InternalError):
        return "BACKEND"
    return "OTHER"
