"""``InferenceResponseSender``: how a decoupled model answers one request, any number of times.

``send(response, flags)`` may be called from any thread, also after ``execute`` has returned;
``flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL`` ends the request (with or without a last
response), after which the sender refuses more (python_backend's texts).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from backends.base import RequestResult, ResponseSink
from backends.python.pb_utils.errors import TritonModelException
from server.errors import InferenceServerError

if TYPE_CHECKING:
    from backends.python.pb_utils.requests import InferenceResponse

COMPLETE_FINAL = 1


class InferenceResponseSender:
    """The sender of one request's responses."""

    def __init__(
        self,
        respond: ResponseSink,
        convert: Callable[[InferenceResponse], RequestResult],
        cancelled: Callable[[], bool],
    ) -> None:
        """``convert`` checks a response and makes it a result; ``respond`` takes it."""
        self._respond = respond
        self._convert = convert
        self._cancelled = cancelled
        self._lock = threading.Lock()
        self._closed = False

    def send(self, response: InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & COMPLETE_FINAL)
        if response is None and not final:
            raise TritonModelException(
                "Inference Response object must be provided when the response flags is set "
                "to zero."
            )
        result = None if response is None else self._convert(response)
        with self._lock:
            if self._closed:
                raise TritonModelException(
                    "Unable to send response. Response sender has been closed."
                )
            self._closed = final
        self._respond(result, final)

    def send_error(self, error: InferenceServerError) -> None:
        """End the request with ``error`` (its ``execute`` failed)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._respond(error, True)

    def is_cancelled(self) -> bool:
        """Whether the client has given up on the request."""
        return self._cancelled()

    @property
    def closed(self) -> bool:
        """Whether the final flag has been sent."""
        return self._closed
