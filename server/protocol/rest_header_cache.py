"""Binary REST requests' JSON headers, decoded once per model and header text.

A load generator or a client in a loop sends the same JSON header with every request: the
same inputs, shapes, sizes and outputs; only the binary bytes after it change. Decoding that
header (parsing, the checks against the model's spec, the parameter checks, building the
tensors' descriptions) cost 14 µs of the 17 µs that decoding a two-input request took on the
loop of a front end. This cache keeps, per model, version and header text, what the header
decoded to, and on a repeat binds the new body's bytes to it. The header checks passed for
that text and that spec, so only the checks that read the body are made again, in the order
``rest_codec.decode_request`` makes them: each input's size against the body and its bytes
(BYTES and BOOL elements), then the bytes left over.

Only headers whose inputs all carry binary data are kept (JSON ``data`` is the request's
content, a shared memory input's region may be unregistered meanwhile), up to ``MAX_HEADER``
bytes each and ``CAPACITY`` headers, the oldest dropped first. A plan holds its spec and is
used only with that very spec: after a model is loaded again its requests are decoded anew.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from server.protocol.datatypes import DataType
from server.protocol.model_spec import ModelSpec
from server.protocol.rest_codec import (
    binary_input,
    check_binary_consumed,
    decode_request,
    parse_json,
)
from server.protocol.types import InferRequest, InputTensor, RequestedOutput

#: Headers longer than this are decoded every time (a client's request ids and parameters
#: are small; a long header is rare and its parsing outweighs a lookup anyway).
MAX_HEADER = 4096
CAPACITY = 256


@dataclass(frozen=True)
class _Input:
    name: str
    datatype: DataType
    shape: tuple[int, ...]
    parameters: dict[str, Any]
    size: int


@dataclass(frozen=True)
class HeaderPlan:
    """What one header decoded to against ``spec``, apart from the body's bytes."""

    spec: ModelSpec
    inputs: tuple[_Input, ...]
    outputs: tuple[RequestedOutput, ...] | None
    request_id: str | None
    parameters: dict[str, Any]

    @classmethod
    def of(cls, request: InferRequest, spec: ModelSpec) -> HeaderPlan | None:
        """The plan of a request decoded from a header, or None if it has an input that is
        not binary data."""
        inputs = []
        for tensor in request.inputs:
            size = tensor.parameters.get("binary_data_size")
            if tensor.shared_memory is not None or type(size) is not int:
                return None
            inputs.append(_Input(tensor.name, tensor.datatype, tensor.shape,
                                 dict(tensor.parameters), size))
        outputs = None
        if request.outputs is not None:
            outputs = tuple(_copy(o) for o in request.outputs)
        return cls(spec, tuple(inputs), outputs, request.id, dict(request.parameters))

    def bind(self, binary: memoryview, model: str, version: str) -> InferRequest:
        """A new request: this header's inputs over ``binary``. Each request gets its own
        parameter dicts and outputs, as a decoded one does."""
        request_id = self.request_id
        inputs: list[InputTensor] = []
        offset = 0
        for item in self.inputs:
            tensor, offset = binary_input(
                item.name, item.datatype, item.shape, dict(item.parameters), item.size, binary,
                offset, model, request_id,
            )
            inputs.append(tensor)
        check_binary_consumed(binary, offset, model)
        outputs = None if self.outputs is None else [_copy(o) for o in self.outputs]
        return InferRequest(model, version, inputs, outputs, request_id, dict(self.parameters))


class HeaderCache:
    """Decodes binary requests, each distinct header once (per model, version and spec).

    Safe to use from the loop and from the threads that decode large requests.
    """

    def __init__(self, capacity: int = CAPACITY) -> None:
        self._capacity = capacity
        self._plans: dict[tuple[str, str, bytes], HeaderPlan] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._plans)

    def decode(
        self,
        header: memoryview,
        binary: memoryview,
        model: str,
        version: str,
        spec: ModelSpec,
        max_data_bytes: int | None,
    ) -> InferRequest:
        """The request of ``header`` (JSON text) and ``binary``, as ``decode_request`` makes
        it, with the same refusals."""
        if len(header) > MAX_HEADER:
            return decode_request(parse_json(header, "inference request"), binary, model,
                                  version, spec, max_data_bytes)
        key = (model, version, bytes(header))
        plan = self._plans.get(key)
        if plan is not None and plan.spec is spec:
            return plan.bind(binary, model, version)
        request = decode_request(parse_json(header, "inference request"), binary, model,
                                 version, spec, max_data_bytes)
        plan = HeaderPlan.of(request, spec)
        if plan is not None:
            self._keep(key, plan)
        return request

    def _keep(self, key: tuple[str, str, bytes], plan: HeaderPlan) -> None:
        with self._lock:
            self._plans.pop(key, None)  # a stale plan (another spec) is replaced
            if len(self._plans) >= self._capacity:
                del self._plans[next(iter(self._plans))]
            self._plans[key] = plan


def _copy(output: RequestedOutput) -> RequestedOutput:
    return RequestedOutput(output.name, dict(output.parameters), output.shared_memory)
