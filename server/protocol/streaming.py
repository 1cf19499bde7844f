"""One reply of a decoupled model's stream, as the data plane hands it to a transport.

A decoupled model answers a request with zero or more responses and then says it is done
(Triton's final flag). The final flag may ride on the last response, or come alone: then
``response`` and ``error`` are both None, and a transport sends it only when its client asked
for empty final responses (``triton_enable_empty_final_response``).
"""

from __future__ import annotations

from dataclasses import dataclass

from server.errors import InferenceServerError
from server.protocol.types import InferResponse

#: The request parameter by which a gRPC client asks for the flags-only final response.
EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"


@dataclass
class StreamReply:
    """A response, or an error standing for one, or neither (a flags-only final)."""

    response: InferResponse | None = None
    error: InferenceServerError | None = None
    final: bool = False
    #: the version that answered (what a flags-only final is sent with)
    model_version: str = ""
