"""The gRPC wire format: ``inference.ModelInferRequest``/``ModelInferResponse`` <-> core records.

Inputs come from ``raw_input_contents`` (one entry per input, in input order, BYTES length-
prefixed) or from typed ``contents`` (``fp32_contents``, ``bytes_contents``, ...), never both in
one request. Responses always carry ``raw_output_contents``, one entry per output in order:
perf_analyzer indexes it blindly and ``tritonclient`` reads nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from server.errors import InvalidArgument
from server.generated import grpc_service_pb2 as pb
from server.protocol import classification, datatypes
from server.protocol.binary import tensor_from_bytes, tensor_to_bytes
from server.protocol.datatypes import DataType
from server.protocol.model_spec import ModelSpec
from server.protocol.parameters import SEQUENCE_FLAGS, check_request_parameters
from server.protocol.shapes import element_count, reshape
from server.protocol.shared_memory_params import KEYS as SHM_KEYS
from server.protocol.shared_memory_params import shared_memory_ref
from server.protocol.types import (
    SHARED_MEMORY_PENDING,
    InferRequest,
    InferResponse,
    InputTensor,
    RequestedOutput,
)
from server.protocol.validation import check_input

#: Reserved keys the C++ client sends on every request (accepted, no effect on a
#: non-decoupled model).
ALLOWED_RESERVED = frozenset({"triton_enable_empty_final_response"})
FINAL_RESPONSE = "triton_final_response"
# datatype name -> the InferTensorContents field that carries it
_CONTENTS_FIELD = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}


def parameter_value(param: pb.InferParameter) -> Any:
    """The Python value of an ``InferParameter`` of any kind (None when unset)."""
    kind = param.WhichOneof("parameter_choice")
    return None if kind is None else getattr(param, kind)


def _set_parameter(param: pb.InferParameter, value: Any) -> None:
    """``param`` set from a response parameter's value (bool, int, float or text)."""
    if isinstance(value, bool):
        param.bool_param = value
    elif isinstance(value, int):
        param.int64_param = value
    elif isinstance(value, float):
        param.double_param = value
    else:
        param.string_param = str(value)


def _parameters(params: Any, what: str) -> dict[str, Any]:
    """``params`` (a protobuf map, not empty) as values; ``what`` names their owner."""
    values = {key: parameter_value(value) for key, value in params.items()}
    for key, value in values.items():
        if value is None:
            raise InvalidArgument(f"parameter '{key}' of {what} has no value")
    return values


#: Request parameters whose protobuf kind is checked, not only their value.
_TYPED = ("timeout", "sequence_id", *SEQUENCE_FLAGS)


def _request_parameters(msg: pb.ModelInferRequest) -> dict[str, Any]:
    protobuf_params = msg.parameters
    if not protobuf_params:  # most requests have none
        return {}
    params = _parameters(protobuf_params, "the request")
    kinds = {
        key: protobuf_params[key].WhichOneof("parameter_choice") for key in _TYPED if key in params
    }
    if "sequence_id" in kinds and kinds["sequence_id"] not in (
        "int64_param", "uint64_param", "string_param"
    ):
        raise InvalidArgument(
            "invalid value type for 'sequence_id' parameter, expected int64_param, "
            "uint64_param or string_param."
        )
    for flag in SEQUENCE_FLAGS:
        if flag in kinds and kinds[flag] != "bool_param":
            raise InvalidArgument(f"invalid value type for '{flag}' parameter, expected bool_param.")
    check_request_parameters(params, ALLOWED_RESERVED)
    if "timeout" in kinds and kinds["timeout"] != "int64_param":
        raise InvalidArgument("Unable to parse 'timeout': expected an int64 parameter")
    return params


def decode_request(
    msg: pb.ModelInferRequest,
    spec: ModelSpec | None = None,
    raw_contents: Sequence[bytes | memoryview] | None = None,
) -> InferRequest:
    """Build an ``InferRequest`` from a ``ModelInferRequest``.

    With the model's ``spec``, each input is checked against it before its data is decoded.
    ``raw_contents`` replaces the message's own ``raw_input_contents`` (see ``split_request``).
    """
    model = msg.model_name
    raw = raw_contents if raw_contents is not None else msg.raw_input_contents
    # The inputs are read from the message once: every read builds Python objects.
    tensors = list(msg.inputs)
    # Inputs in shared memory have no raw_input_contents entry: the others have one each.
    in_band = [
        index
        for index, tensor in enumerate(tensors)
        if not (tensor.parameters and any(key in tensor.parameters for key in SHM_KEYS))
    ]
    raw_of: list[bytes | memoryview | None] = [None] * len(tensors)
    if raw:
        for tensor in tensors:
            if tensor.HasField("contents"):
                raise InvalidArgument(
                    "contents field must not be specified when using raw_input_contents for "
                    f"'{tensor.name}' for model '{model}'"
                )
        if len(raw) != len(in_band):
            raise InvalidArgument(
                f"expected {len(in_band)} raw input contents for model '{model}', got "
                f"{len(raw)}: raw_input_contents must hold one entry per input not in shared "
                "memory, in order"
            )
        for index, contents in zip(in_band, raw, strict=True):
            raw_of[index] = contents
    request_id = msg.id
    inputs = [
        _decode_input(tensor, contents, model, spec, request_id)
        for tensor, contents in zip(tensors, raw_of, strict=True)
    ]
    outputs = [_decode_output(output) for output in msg.outputs] or None
    return InferRequest(
        model_name=model,
        model_version=msg.model_version,
        inputs=inputs,
        outputs=outputs,
        id=request_id or None,
        parameters=_request_parameters(msg),
    )


def _decode_input(
    tensor: pb.ModelInferRequest.InferInputTensor,
    raw: bytes | memoryview | None,
    model: str,
    spec: ModelSpec | None,
    request_id: str,
) -> InputTensor:
    name = tensor.name
    datatype = datatypes.from_name(tensor.datatype)
    shape = tuple(tensor.shape)
    if shape and min(shape) < 0:
        raise InvalidArgument(
            f"Unable to parse 'shape' of input '{name}': dims must be non-negative"
        )
    if spec is not None:
        check_input(spec, name, datatype, shape, request_id)
    protobuf_params = tensor.parameters
    if protobuf_params:
        params = _parameters(protobuf_params, f"input '{name}'")
        region = shared_memory_ref(params, f"input '{name}'")
        if region is not None:
            if tensor.HasField("contents"):
                raise InvalidArgument(
                    f"input '{name}' sets 'shared_memory_region' and also carries contents"
                )
            return InputTensor(name, datatype, shape, SHARED_MEMORY_PENDING, params, region)
    else:
        params = {}
    if raw is not None:
        data = tensor_from_bytes(memoryview(raw), datatype, shape, name, model, request_id)
    else:
        data = _from_contents(tensor.contents, datatype, shape, name, model)
    return InputTensor(name, datatype, shape, data, params)


def _from_contents(
    contents: pb.InferTensorContents,
    datatype: DataType,
    shape: tuple[int, ...],
    name: str,
    model: str,
) -> np.ndarray:
    field = _CONTENTS_FIELD.get(datatype.name)
    if field is None:
        raise InvalidArgument(
            f"{datatype.name} input '{name}' for model '{model}' must be sent in "
            "raw_input_contents: InferTensorContents has no field for it"
        )
    for other in set(_CONTENTS_FIELD.values()) - {field}:
        if len(getattr(contents, other)):
            raise InvalidArgument(
                f"input '{name}' for model '{model}' has datatype {datatype.name} but carries "
                f"'{other}'; expected '{field}'"
            )
    values = getattr(contents, field)
    expected = element_count(shape)
    if len(values) != expected:
        raise InvalidArgument(
            f"expected {expected} elements in '{field}' of input '{name}' for model "
            f"'{model}', got {len(values)}"
        )
    if datatype.is_bytes:
        array = np.empty(expected, dtype=object)
        array[:] = list(values)
    elif datatype.dtype.kind in "iu":
        array = _narrowed(values, datatype, name)
    else:
        array = np.array(values, dtype=datatype.dtype)
    return reshape(array, shape, name)


def _narrowed(values: Iterable[int], datatype: DataType, name: str) -> np.ndarray:
    """INT8/16 arrive in int32 contents and UINT8/16 in uint32: refuse values that don't fit."""
    wide = np.array(values, dtype=np.int64 if datatype.name != "UINT64" else np.uint64)
    info = np.iinfo(datatype.dtype)
    if wide.size and (int(wide.min()) < info.min or int(wide.max()) > info.max):
        raise InvalidArgument(
            f"a value of input '{name}' is out of range for {datatype.name} "
            f"[{info.min}, {info.max}]"
        )
    return wide.astype(datatype.dtype)


def _decode_output(output: pb.ModelInferRequest.InferRequestedOutputTensor) -> RequestedOutput:
    name = output.name
    protobuf_params = output.parameters
    if not protobuf_params:  # most ask for nothing but the tensor
        return RequestedOutput(name)
    params = _parameters(protobuf_params, f"output '{name}'")
    region = shared_memory_ref(params, f"output '{name}'")
    if classification.PARAMETER in params:
        _check_class_count(output, params[classification.PARAMETER], region is not None)
    return RequestedOutput(name, params, region)


def _check_class_count(
    output: pb.ModelInferRequest.InferRequestedOutputTensor, count: Any, in_shared_memory: bool
) -> None:
    """An ``int64_param`` (what tritonclient's ``class_count`` sets), not negative."""
    kind = output.parameters[classification.PARAMETER].WhichOneof("parameter_choice")
    if kind != "int64_param":
        raise InvalidArgument(
            "invalid value type for 'classification' parameter, expected int64_param"
        )
    # A negative count gets the HTTP text, so that both transports say the same.
    classification.parse_count(count, in_shared_memory)


# --- Wire-level fast path -------------------------------------------------------------------
# protobuf copies every bytes field it parses or serializes, and serializing a 16 MiB message
# takes ~50 ms in the Python runtime. ModelInfer therefore reads and writes the tensor fields
# itself: ``raw_input_contents`` become views of the received bytes, and ``raw_output_contents``
# are appended to the small serialized header, one copy in all.

_RAW_INPUT_FIELD = 7  # ModelInferRequest.raw_input_contents
_RAW_OUTPUT_TAG = bytes([6 << 3 | 2])  # ModelInferResponse.raw_output_contents, length-delimited
_INFER_RESPONSE_TAG = bytes([2 << 3 | 2])  # ModelStreamInferResponse.infer_response


def _read_varint(view: memoryview, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(view) or shift > 63:
            raise InvalidArgument("malformed ModelInferRequest: bad varint")
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


#: Below this size a request is parsed by protobuf whole: copying a few kilobytes of tensor
#: bytes costs less than walking the fields in Python (16 varints for a 2-input request).
SPLIT_ABOVE_BYTES = 1 << 16


def split_request(
    data: bytes | bytearray | memoryview, whole_if_small: bool = True
) -> tuple[pb.ModelInferRequest, list[memoryview] | None]:
    """Parse a serialized ``ModelInferRequest`` without copying its tensor bytes: the message
    without ``raw_input_contents``, and those contents as views of ``data``. With
    ``whole_if_small``, a small one is parsed whole (None: its contents are the message's)."""
    if whole_if_small and len(data) <= SPLIT_ABOVE_BYTES:
        try:
            whole = data if isinstance(data, bytes) else bytes(data)
            return pb.ModelInferRequest.FromString(whole), None
        except DecodeError as exc:
            raise InvalidArgument(f"malformed ModelInferRequest: {exc}") from None
    view = memoryview(data)
    kept: list[memoryview] = []
    raw: list[memoryview] = []
    pos = 0
    while pos < len(view):
        start = pos
        key, pos = _read_varint(view, pos)
        wire_type = key & 7
        if wire_type == 0:
            _, pos = _read_varint(view, pos)
        elif wire_type == 1:
            pos += 8
        elif wire_type == 5:
            pos += 4
        elif wire_type == 2:
            length, pos = _read_varint(view, pos)
            if key >> 3 == _RAW_INPUT_FIELD:
                if pos + length > len(view):
                    raise InvalidArgument("malformed ModelInferRequest: truncated field")
                raw.append(view[pos : pos + length])
                pos += length
                continue
            pos += length
        else:
            raise InvalidArgument(f"malformed ModelInferRequest: wire type {wire_type}")
        if pos > len(view):
            raise InvalidArgument("malformed ModelInferRequest: truncated field")
        kept.append(view[start:pos])
    try:
        return pb.ModelInferRequest.FromString(b"".join(kept)), raw
    except DecodeError as exc:
        raise InvalidArgument(f"malformed ModelInferRequest: {exc}") from None


#: Response headers without an id or parameters, by what they hold: a model's answers repeat
#: one header (names, datatypes, shapes), and building it with protobuf is half the encoding.
_HEADERS: dict[tuple[Any, ...], bytes] = {}
_HEADERS_KEPT = 1024  # distinct headers kept before the cache starts afresh


def _header(response: InferResponse, stream: bool, final: bool) -> bytes:
    """The serialized ``ModelInferResponse`` without its ``raw_output_contents``."""
    header = pb.ModelInferResponse(
        model_name=response.model_name,
        model_version=response.model_version,
        id=response.id or "",
    )
    for output in response.outputs:
        header.outputs.add(name=output.name, datatype=output.datatype.name, shape=output.shape)
    for key, value in response.parameters.items():  # a model's own, as Triton sends them
        _set_parameter(header.parameters[key], value)
    if stream:
        header.parameters[FINAL_RESPONSE].bool_param = final
    return header.SerializeToString()


def _plain_header(response: InferResponse) -> bytes:
    """``_header`` of a unary response without an id or parameters, from ``_HEADERS``."""
    key = (
        response.model_name,
        response.model_version,
        *[(o.name, o.datatype.name, *o.shape) for o in response.outputs],
    )
    head = _HEADERS.get(key)
    if head is None:
        if len(_HEADERS) >= _HEADERS_KEPT:
            _HEADERS.clear()
        head = _HEADERS[key] = _header(response, False, True)
    return head


def encode_response_bytes(
    response: InferResponse, stream: bool = False, final: bool = True
) -> bytes:
    """The serialized ``ModelInferResponse`` (with ``stream``, the ``ModelStreamInferResponse``
    carrying it): ``encode_response_parts`` in one copy."""
    return b"".join(encode_response_parts(response, stream, final))


def encode_response_parts(
    response: InferResponse, stream: bool = False, final: bool = True
) -> list[bytes | memoryview]:
    """The serialized ``ModelInferResponse`` in parts: header fields by protobuf, then one
    ``raw_output_contents`` entry per output, in order, each tensor's bytes a view of its
    array, not a copy. With ``stream``, the ``ModelStreamInferResponse`` carrying it (its
    ``triton_final_response`` parameter says ``final``: False on a decoupled model's
    responses before its last)."""
    parts: list[bytes | memoryview] = []
    for output in response.outputs:
        if output.shared_memory is not None:  # in the client's region: an empty entry, as Triton
            parts += [_RAW_OUTPUT_TAG, _varint(0)]
            continue
        blob = tensor_to_bytes(output.data, output.datatype)
        parts += [_RAW_OUTPUT_TAG, _varint(blob.nbytes), blob]
    if stream or response.id or response.parameters:
        head = _header(response, stream, final)
    else:
        head = _plain_header(response)
    if not stream:
        return [head, *parts]
    size = len(head) + sum(len(part) for part in parts)
    return [_INFER_RESPONSE_TAG, _varint(size), head, *parts]
