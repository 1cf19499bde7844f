"""gRPC status codes and how a call's status travels (the ``grpc-status`` and ``grpc-message``
trailers of gRPC over HTTP/2), with the code of each of the server's errors from the one table
in ``server.errors``."""

from __future__ import annotations

import enum
import urllib.parse

from server.errors import InferenceServerError


class StatusCode(enum.IntEnum):
    """The codes of ``grpc.StatusCode``, by the same names, as they go on the wire."""

    OK = 0
    CANCELLED = 1
    UNKNOWN = 2
    INVALID_ARGUMENT = 3
    DEADLINE_EXCEEDED = 4
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    ABORTED = 10
    OUT_OF_RANGE = 11
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15
    UNAUTHENTICATED = 16


def status_code(error: InferenceServerError) -> StatusCode:
    """The gRPC code of an error, from the one table in ``server.errors``."""
    return StatusCode[error.grpc_status_name]


class AbortError(Exception):
    """Ends a call with ``code`` and ``message`` (``CallContext.abort``); what the handler
    returned or yielded so far stands."""

    def __init__(self, code: StatusCode, message: str) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message


#: Bytes that travel as they are in ``grpc-message``: printable ASCII except '%' (gRPC's
#: PROTOCOL-HTTP2 spec); everything else is percent-encoded from the message's UTF-8.
_PLAIN = bytes(range(0x20, 0x7F)).replace(b"%", b"").decode("ascii")


#: The longest ``grpc-message`` sent, encoded: grpc clients refuse trailers over 8 KiB (their
#: soft limit on metadata) and then report RESOURCE_EXHAUSTED instead of the status.
MAX_MESSAGE_BYTES = 4096


def encode_message(message: str) -> bytes:
    """``grpc-message``'s value for ``message``, cut to ``MAX_MESSAGE_BYTES`` (at a whole
    character)."""
    encoded = urllib.parse.quote(message, safe=_PLAIN).encode("ascii")
    if len(encoded) <= MAX_MESSAGE_BYTES:
        return encoded
    cut = encoded[:MAX_MESSAGE_BYTES]
    escape = cut.rfind(b"%", len(cut) - 2)
    if escape >= 0:
        cut = cut[:escape]
    # Whole characters only: what the cut left of a multi-byte one goes too.
    whole = urllib.parse.unquote_to_bytes(cut).decode("utf-8", "ignore")
    return urllib.parse.quote(whole, safe=_PLAIN).encode("ascii")
