"""Inference requests' headers, decoded once per header text and model spec.

A load generator or a client in a loop sends the same request header again and again: the
same inputs, shapes, sizes and outputs; only the tensor bytes change. Decoding that header
(the checks against the model's spec, the parameter checks, building the tensors'
descriptions) is most of a small request's decoding: of perf_analyzer's two-input request,
8.7 of 10.0 µs over HTTP (the JSON header), and 14 of 15 µs over gRPC, where every field read
from the protobuf message builds Python objects. ``HeaderCache`` keeps what a header decoded
to (a ``HeaderPlan``), and on a repeat binds the new tensor bytes to it. The header's checks
passed for that text and that spec, so only the checks that read the bytes are made again, in
the order the codec makes them: each input's bytes against its size and shape (BYTES and BOOL
elements too), then, over HTTP, the bytes left over.

- HTTP (``decode_rest``): the key is the JSON header's text. Kept only when every input carries
  binary data: JSON ``data`` is the request's content, and a shared memory input's region may
  be unregistered meanwhile.
- gRPC (``decode_grpc``): the key is the ``ModelInferRequest`` without ``raw_input_contents``,
  serialized deterministically (2 µs with the parse, against 15 µs of decoding). Kept only when
  every input is in ``raw_input_contents``.

A header is kept the second time it is seen: requests that each carry their own header (an id
per request, a sequence's flags) then cost a lookup and a note, not a plan each. Headers longer
than ``MAX_HEADER`` bytes, and those with a parameter whose value is a JSON array or object (a
request's own, which it may change), are decoded every time; at most ``CAPACITY`` are kept, the
oldest dropped first. A plan holds its spec and is used only with that very spec: after a model
is loaded again its requests are decoded anew.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from server.generated import grpc_service_pb2 as pb
from server.protocol import grpc_codec
from server.protocol.binary import tensor_from_bytes
from server.protocol.datatypes import DataType
from server.protocol.model_spec import ModelSpec
from server.protocol.rest_codec import (
    binary_input,
    check_binary_consumed,
    decode_request,
    parse_json,
)
from server.protocol.types import InferRequest, InputTensor, RequestedOutput

#: Headers longer than this are decoded every time (request ids and parameters are small; a
#: long header is rare and its parsing outweighs a lookup anyway).
MAX_HEADER = 4096
CAPACITY = 256
_RAW_FIELD = "raw_input_contents"


@dataclass(frozen=True)
class _Input:
    name: str
    datatype: DataType
    shape: tuple[int, ...]
    parameters: dict[str, Any]
    size: int  # HTTP: its binary_data_size (gRPC: unused, -1)


@dataclass(frozen=True)
class HeaderPlan:
    """What one header decoded to against ``spec``, apart from the tensor bytes."""

    spec: ModelSpec
    inputs: tuple[_Input, ...]
    outputs: tuple[RequestedOutput, ...] | None
    request_id: str | None
    parameters: dict[str, Any]

    @classmethod
    def of(cls, request: InferRequest, spec: ModelSpec, binary: bool) -> HeaderPlan | None:
        """The plan of a decoded request, or None if it has an input whose data is not bytes
        sent with it (``binary``: HTTP's binary data, each sized by its parameters) or a
        parameter whose value could be changed in place."""
        if not _flat(request.parameters) or any(
            not _flat(output.parameters) for output in request.outputs or ()
        ):
            return None
        inputs = []
        for tensor in request.inputs:
            size = tensor.parameters.get("binary_data_size") if binary else -1
            if tensor.shared_memory is not None or type(size) is not int:
                return None
            if not _flat(tensor.parameters):
                return None
            inputs.append(_Input(tensor.name, tensor.datatype, tensor.shape,
                                 dict(tensor.parameters), size))
        outputs = None
        if request.outputs is not None:
            outputs = tuple(_copy(o) for o in request.outputs)
        return cls(spec, tuple(inputs), outputs, request.id, dict(request.parameters))

    def bind_binary(self, binary: memoryview, model: str, version: str) -> InferRequest:
        """HTTP: a new request, this header's inputs over the binary part of a body."""
        inputs: list[InputTensor] = []
        offset = 0
        for item in self.inputs:
            tensor, offset = binary_input(
                item.name, item.datatype, item.shape, dict(item.parameters), item.size, binary,
                offset, model, self.request_id,
            )
            inputs.append(tensor)
        check_binary_consumed(binary, offset, model)
        return self._request(model, version, inputs)

    def bind_raw(
        self, contents: Sequence[bytes | memoryview], model: str, version: str
    ) -> InferRequest:
        """gRPC: a new request, this header's inputs over ``raw_input_contents`` (as many as
        there are inputs: the caller checks)."""
        inputs = [
            InputTensor(
                item.name, item.datatype, item.shape,
                tensor_from_bytes(memoryview(raw), item.datatype, item.shape, item.name, model,
                                  self.request_id),
                dict(item.parameters),
            )
            for item, raw in zip(self.inputs, contents, strict=True)
        ]
        return self._request(model, version, inputs)

    def _request(self, model: str, version: str, inputs: list[InputTensor]) -> InferRequest:
        """Each request gets its own parameter dicts and outputs, as a decoded one does."""
        outputs = None if self.outputs is None else [_copy(o) for o in self.outputs]
        return InferRequest(model, version, inputs, outputs, self.request_id,
                            dict(self.parameters))


class HeaderCache:
    """Plans by header (and model), the oldest dropped past ``capacity``; headers seen once,
    as many. Safe to use from the loop and from the threads that decode large requests."""

    def __init__(self, capacity: int = CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"a header cache holds at least one header, not {capacity}")
        self._capacity = capacity
        self._plans: dict[tuple[str, str, bytes], HeaderPlan] = {}
        self._seen: dict[tuple[str, str, bytes], None] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._plans)

    def plan(self, key: tuple[str, str, bytes], spec: ModelSpec) -> HeaderPlan | None:
        """The plan kept for ``key``, if it was made against ``spec``."""
        plan = self._plans.get(key)
        return plan if plan is not None and plan.spec is spec else None

    def seen_before(self, key: tuple[str, str, bytes]) -> bool:
        """Whether ``key`` was looked up and missed before (or has a plan for another spec);
        noted now if not."""
        if key in self._plans or key in self._seen:
            return True
        with self._lock:
            _add(self._seen, key, None, self._capacity)
        return False

    def keep(self, key: tuple[str, str, bytes], plan: HeaderPlan | None) -> None:
        if plan is None:
            return
        with self._lock:
            self._seen.pop(key, None)
            _add(self._plans, key, plan, self._capacity)


def decode_rest(
    cache: HeaderCache,
    header: memoryview,
    binary: memoryview,
    model: str,
    version: str,
    spec: ModelSpec,
    max_data_bytes: int | None,
) -> InferRequest:
    """``rest_codec.decode_request`` of ``header`` (JSON text) and ``binary``, with the same
    refusals, each header text decoded once."""
    if len(header) > MAX_HEADER:
        return decode_request(parse_json(header, "inference request"), binary, model, version,
                              spec, max_data_bytes)
    key = (model, version, bytes(header))
    plan = cache.plan(key, spec)
    if plan is not None:
        return plan.bind_binary(binary, model, version)
    request = decode_request(parse_json(header, "inference request"), binary, model, version,
                             spec, max_data_bytes)
    if cache.seen_before(key):
        cache.keep(key, HeaderPlan.of(request, spec, binary=True))
    return request


def decode_grpc(
    cache: HeaderCache,
    message: pb.ModelInferRequest,
    spec: ModelSpec | None,
    raw: Sequence[bytes | memoryview] | None,
) -> InferRequest:
    """``grpc_codec.decode_request`` of ``message`` and ``raw`` (its ``raw_input_contents``
    when None, which are then moved out of it), with the same refusals, each header decoded
    once."""
    if raw is None:
        raw = list(message.raw_input_contents)
        if raw:
            message.ClearField(_RAW_FIELD)
    if spec is None or not raw:  # typed contents, or shared memory only: decoded each time
        return grpc_codec.decode_request(message, spec, raw)
    header = message.SerializeToString(deterministic=True)
    if len(header) > MAX_HEADER:
        return grpc_codec.decode_request(message, spec, raw)
    key = ("", "", header)  # (the model's name and version are in the message)
    plan = cache.plan(key, spec)
    if plan is not None and len(plan.inputs) == len(raw):
        return plan.bind_raw(raw, message.model_name, message.model_version)
    request = grpc_codec.decode_request(message, spec, raw)
    if cache.seen_before(key):
        cache.keep(key, HeaderPlan.of(request, spec, binary=False))
    return request


def _add(entries: dict[Any, Any], key: Any, value: Any, capacity: int) -> None:
    """Put ``key`` last in ``entries`` (a stale entry is replaced), the oldest dropped past
    ``capacity``."""
    entries.pop(key, None)
    if len(entries) >= capacity:
        del entries[next(iter(entries))]
    entries[key] = value


def _flat(parameters: dict[str, Any]) -> bool:
    """No value is a list or a dict (JSON's arrays and objects), which a request could change
    in place: shallow copies are then copies."""
    for value in parameters.values():  # a loop: no generator per parameter set
        if type(value) is list or type(value) is dict:
            return False
    return True


def _copy(output: RequestedOutput) -> RequestedOutput:
    return RequestedOutput(output.name, dict(output.parameters), output.shared_memory)
