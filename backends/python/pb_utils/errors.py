"""``TritonError`` (a per-request error a model answers with) and ``TritonModelException``.

The codes are Triton's ``TRITONSERVER_Error_Code`` numbers. Each maps to one class of
``server.errors``, so that a request failed by its model gets the HTTP status and gRPC code
Triton gives that code (triton-facts §1.3: UNKNOWN, INVALID_ARG, ALREADY_EXISTS and CANCELLED
400; NOT_FOUND 404; UNAVAILABLE 503; UNSUPPORTED 501; INTERNAL 500).
"""

from __future__ import annotations

from server import errors


class TritonModelException(Exception):
    """Raised by this module's helpers when a model uses them wrongly; raised from
    ``execute`` it fails the requests of that call, like any exception."""


class TritonError:
    """An error with a code: ``InferenceResponse(error=TritonError("msg", TritonError.X))``."""

    UNKNOWN = 0
    INTERNAL = 1
    NOT_FOUND = 2
    INVALID_ARG = 3
    UNAVAILABLE = 4
    UNSUPPORTED = 5
    ALREADY_EXISTS = 6
    CANCELLED = 7

    def __init__(self, message: str, code: int = INTERNAL) -> None:
        if code not in _SERVER_ERRORS:
            raise TritonModelException(f"TritonError: unknown error code {code!r}")
        self._message = str(message)
        self._code = code

    def message(self) -> str:
        return self._message

    def code(self) -> int:
        return self._code

    def __repr__(self) -> str:
        return f"TritonError({self._message!r}, {self._code})"

    def to_server_error(self) -> errors.InferenceServerError:
        """The error of ``server.errors`` that answers the request (its text unchanged)."""
        return _SERVER_ERRORS[self._code](self._message)


_SERVER_ERRORS: dict[int, type[errors.InferenceServerError]] = {
    TritonError.UNKNOWN: errors.UnknownError,
    TritonError.INTERNAL: errors.InternalError,
    TritonError.NOT_FOUND: errors.NotFound,
    TritonError.INVALID_ARG: errors.InvalidArgument,
    TritonError.UNAVAILABLE: errors.Unavailable,
    TritonError.UNSUPPORTED: errors.Unsupported,
    TritonError.ALREADY_EXISTS: errors.AlreadyExists,
    TritonError.CANCELLED: errors.Cancelled,
}
