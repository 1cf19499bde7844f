"""The V2 REST wire format: JSON inference header plus binary tensor data, both directions.

Sans-I/O: the HTTP handler hands over the parsed JSON header and a memoryview of the binary
part of the body; binary inputs become numpy views of that memoryview. Responses come back as
JSON header bytes plus a list of memoryviews to write after it, never joined.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from server.errors import InvalidArgument
from server.protocol import classification, datatypes, json_codec
from server.protocol.binary import tensor_from_bytes, tensor_to_bytes, written_as_view
from server.protocol.datatypes import DataType
from server.protocol.json_codec import MAX_JSON_DEPTH
from server.protocol.model_spec import ModelSpec
from server.protocol.parameters import check_request_parameters
from server.protocol.refusals import request_refused
from server.protocol.shapes import element_count
from server.protocol.shared_memory_params import REGION, shared_memory_ref
from server.protocol.types import (
    SHARED_MEMORY_PENDING,
    InferRequest,
    InferResponse,
    InputTensor,
    RequestedOutput,
)
from server.protocol.validation import check_input


@dataclass
class EncodedResponse:
    """A response ready to write: JSON header, then ``blobs`` in order (binary outputs)."""

    header: bytes
    blobs: list[memoryview]

    @property
    def binary(self) -> bool:
        return bool(self.blobs)

    @property
    def size(self) -> int:
        return len(self.header) + sum(blob.nbytes for blob in self.blobs)


def parse_json(data: bytes | memoryview, what: str = "request") -> Any:
    """Parse JSON text, with a 400 naming what was being parsed."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        if "depth limit" in str(exc):  # orjson stops at 1024 levels, before any stack risk
            raise InvalidArgument(
                f"JSON nesting depth exceeds maximum allowed limit ({MAX_JSON_DEPTH})"
            ) from None
        raise InvalidArgument(f"failed to parse the {what} JSON: {exc}") from None


def _field(obj: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str) -> Any:
    value = obj[key]
    if type(value) is kind:  # what JSON gives for a well-formed request
        return value
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        names = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise InvalidArgument(f"Unable to parse '{key}' of {what}: expected {names}")
    return value


def _parameters(obj: dict[str, Any], what: str) -> dict[str, Any]:
    if "parameters" not in obj:
        return {}
    params = obj["parameters"]
    if not isinstance(params, dict):
        raise InvalidArgument(f"Unable to parse 'parameters' of {what}: expected an object")
    return params


def _shape(value: Any, name: str) -> tuple[int, ...]:
    if type(value) is list:
        for dim in value:  # a loop: no generator per input
            if type(dim) is not int or dim < 0:
                break
        else:
            return tuple(value)
    raise InvalidArgument(
        f"Unable to parse 'shape' of input '{name}': expected an array of non-negative integers"
    )


def _request_parameters(header: dict[str, Any]) -> dict[str, Any]:
    params = _parameters(header, "the request")
    check_request_parameters(params)
    if "binary_data_output" in params and not isinstance(params["binary_data_output"], bool):
        raise InvalidArgument("Unable to parse 'binary_data_output': expected a boolean")
    return params


def decode_request(
    header: Any,
    binary: memoryview,
    model_name: str,
    model_version: str,
    spec: ModelSpec | None = None,
    max_data_bytes: int | None = None,
) -> InferRequest:
    """Build an ``InferRequest`` from the JSON header and the binary part of the body.

    With the model's ``spec``, each input is checked against it before its data is decoded.
    ``max_data_bytes`` (``--http-max-input-size``) bounds what the JSON ``data`` of all inputs
    together decodes to, as it bounds a body: ``0,`` is two characters of JSON and eight bytes
    of FP64.
    """
    if not isinstance(header, dict):
        raise InvalidArgument("the inference request must be a JSON object")
    if "inputs" not in header:
        raise InvalidArgument("missing 'inputs' in the inference request")
    raw_inputs = _field(header, "inputs", list, "the request")
    params = _request_parameters(header)
    request_id = _field(header, "id", str, "the request") if "id" in header else None
    inputs: list[InputTensor] = []
    offset = 0
    budget = _DataBudget(max_data_bytes)
    for raw in raw_inputs:
        tensor, offset = _decode_input(raw, binary, offset, model_name, spec, budget, request_id)
        inputs.append(tensor)
    check_binary_consumed(binary, offset, model_name)
    # An empty output list asks for every output, as in Triton (and gRPC cannot tell them apart).
    outputs = _decode_outputs(header) if header.get("outputs", []) != [] else None
    return InferRequest(model_name, model_version, inputs, outputs, request_id, params)


@dataclass
class _DataBudget:
    """What the JSON ``data`` of a request's inputs may still decode to (None: no bound)."""

    limit: int | None
    used: int = 0

    def take(self, datatype: DataType, shape: tuple[int, ...], name: str) -> None:
        """Charge an input's decoded size (8 bytes per BYTES element: a pointer, the bytes
        themselves are in the body) before it is decoded."""
        if self.limit is None:
            return
        self.used += element_count(shape) * (datatype.itemsize or 8)
        if self.used > self.limit:
            raise InvalidArgument(
                f"request JSON data of {self.used} bytes (decoded, up to input '{name}') exceeds "
                f"the maximum allowed input size of {self.limit} bytes. Use "
                "--http-max-input-size to increase the limit."
            )


def _decode_input(
    raw: Any,
    binary: memoryview,
    offset: int,
    model: str,
    spec: ModelSpec | None,
    budget: _DataBudget,
    request_id: str | None,
) -> tuple[InputTensor, int]:
    if not isinstance(raw, dict):
        raise InvalidArgument("each element of 'inputs' must be a JSON object")
    for key in ("name", "shape", "datatype"):
        if key not in raw:
            raise InvalidArgument(f"missing '{key}' in an input of the inference request")
    name = _field(raw, "name", str, "an input")
    shape = _shape(raw["shape"], name)
    datatype = datatypes.from_name(raw["datatype"])
    if spec is not None:
        check_input(spec, name, datatype, shape, request_id)
    what = f"input '{name}'"
    params = _parameters(raw, what)
    region = shared_memory_ref(params, what)
    has_data = "data" in raw
    has_size = "binary_data_size" in params
    if has_data + has_size + (region is not None) > 1:  # Triton's text, and the input
        given = (
            ("'data'", has_data), ("'binary_data_size'", has_size), (f"'{REGION}'", region)
        )
        sources = " ".join(source for source, present in given if present)
        raise InvalidArgument(
            "Input must set only one of the following fields: 'data', 'binary_data_size' in "
            f"'parameters', '{REGION}' in 'parameters'. But set {sources} (input '{name}')"
        )
    if region is not None:
        return InputTensor(name, datatype, shape, SHARED_MEMORY_PENDING, params, region), offset
    if has_size:
        size = params["binary_data_size"]
        if type(size) is not int or size < 0:
            raise InvalidArgument(
                f"Unable to parse 'binary_data_size' of input '{name}': expected a non-negative "
                "integer"
            )
        return binary_input(name, datatype, shape, params, size, binary, offset, model,
                            request_id)
    if "data" not in raw:
        raise InvalidArgument(f"input '{name}' has neither 'data' nor 'binary_data_size'")
    budget.take(datatype, shape, name)
    data = json_codec.decode_data(raw["data"], datatype, shape, name)
    return InputTensor(name, datatype, shape, data, params), offset


def binary_input(
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    params: dict[str, Any],
    size: int,
    binary: memoryview,
    offset: int,
    model: str,
    request_id: str | None,
) -> tuple[InputTensor, int]:
    """The input whose ``size`` bytes start at ``offset`` of ``binary``, and the offset after
    them; refused if the body is too short or the bytes do not make the tensor."""
    if offset + size > len(binary):
        if not binary:
            raise InvalidArgument(
                "must specify valid 'Infer-Header-Content-Length' in request header and "
                "'binary_data_size' when passing inputs in binary data format"
            )
        raise InvalidArgument(
            f"unexpected size for input '{name}', expecting {size} additional bytes for "
            f"model '{model}'"
        )
    view = binary[offset : offset + size]
    data = tensor_from_bytes(view, datatype, shape, name, model, request_id)
    return InputTensor(name, datatype, shape, data, params), offset + size


def check_binary_consumed(binary: memoryview, offset: int, model: str) -> None:
    """Refuse bytes left after the last binary input."""
    if offset != len(binary):
        raise InvalidArgument(
            f"unexpected additional input data for model '{model}': {len(binary) - offset} "
            "bytes after the last binary input"
        )


def _decode_outputs(header: dict[str, Any]) -> list[RequestedOutput]:
    outputs = []
    for raw in _field(header, "outputs", list, "the request"):
        if not isinstance(raw, dict) or "name" not in raw:
            raise InvalidArgument("each element of 'outputs' must be an object with a 'name'")
        name = _field(raw, "name", str, "an output")
        params = _parameters(raw, f"output '{name}'")
        if "binary_data" in params and not isinstance(params["binary_data"], bool):
            raise InvalidArgument(
                f"Unable to parse 'binary_data' of output '{name}': expected a boolean"
            )
        region = shared_memory_ref(params, f"output '{name}'")
        if region is not None and params.get("binary_data"):
            raise InvalidArgument("Output can't set both 'shared_memory_region' and 'binary_data'")
        if classification.PARAMETER in params:
            classification.parse_count(params[classification.PARAMETER], region is not None)
        outputs.append(RequestedOutput(name, params, region))
    return outputs


def decode_raw_request(body: memoryview, spec: ModelSpec, model_version: str) -> InferRequest:
    """A raw binary request (``Inference-Header-Content-Length: 0``): the body is the one input,
    batch 1, its shape deduced from the model's spec."""
    model = spec.name
    if len(spec.inputs) != 1:
        raise request_refused(
            None,
            f"Raw request must only have 1 input (found 1) to be deduced but got "
            f"{len(spec.inputs)} inputs in '{model}' model configuration",
        )
    (tensor,) = spec.inputs.values()
    datatype = tensor.datatype
    dims = list(tensor.dims)
    if datatype.is_bytes:
        if dims != [1]:
            raise request_refused(
                None,
                f"For BYTE datatype raw input '{tensor.name}', the model must have input shape "
                "[1]",
            )
        # The body is the one element itself, not length-prefixed.
        shape: tuple[int, ...] = (1, 1) if spec.batching else (1,)
        data = _single_bytes_element(body).reshape(shape)
        return _raw_request(spec, model_version, tensor.name, datatype, shape, data)
    variable = [i for i, d in enumerate(dims) if d == -1]
    if len(variable) > 1:
        raise request_refused(
            None,
            f"The shape of the raw input '{tensor.name}' can not be deduced because there are "
            "more than one variable-sized dimension",
        )
    if variable:
        fixed = element_count(tuple(d for d in dims if d != -1)) * datatype.itemsize
        if fixed == 0 or len(body) % fixed:
            raise InvalidArgument(
                f"the raw input '{tensor.name}' of {len(body)} bytes is not a whole number of "
                f"elements of shape {dims} for model '{model}'"
            )
        dims[variable[0]] = len(body) // fixed
    shape = (1, *dims) if spec.batching else tuple(dims)
    data = tensor_from_bytes(body, datatype, shape, tensor.name, model, None)
    return _raw_request(spec, model_version, tensor.name, datatype, shape, data)


def _single_bytes_element(body: memoryview) -> np.ndarray:
    out = np.empty(1, dtype=object)
    out[0] = bytes(body)
    return out


def _raw_request(
    spec: ModelSpec,
    model_version: str,
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    data: np.ndarray,
) -> InferRequest:
    return InferRequest(
        spec.name,
        model_version,
        [InputTensor(name, datatype, shape, data)],
        None,
        None,
        {"binary_data_output": True},
    )


def _binary_outputs(request: InferRequest) -> Callable[[str], bool]:
    """Whether an output goes binary: its own ``binary_data`` says so, else the request's
    ``binary_data_output`` does."""
    default_binary = bool(request.parameters.get("binary_data_output", False))
    per_output = {o.name: o.parameters for o in request.outputs or ()}
    return lambda name: bool(per_output.get(name, {}).get("binary_data", default_binary))


def encoding_cost(response: InferResponse, request: InferRequest) -> int:
    """The bytes ``encode_response`` converts or copies: outputs written as JSON, BYTES, and
    binary outputs not contiguous and little-endian. The others go out as views."""
    binary = _binary_outputs(request)
    total = 0
    for output in response.outputs:
        if output.shared_memory is None and not (
            binary(output.name) and written_as_view(output.data, output.datatype)
        ):
            total += output.data.nbytes
    return total


def encode_response(response: InferResponse, request: InferRequest) -> EncodedResponse:
    """The JSON header and binary blobs for ``response`` (which outputs are binary:
    ``_binary_outputs``)."""
    is_binary = _binary_outputs(request)
    blobs: list[memoryview] = []
    outputs: list[dict[str, Any]] = []
    for output in response.outputs:
        binary = is_binary(output.name)
        entry: dict[str, Any] = {
            "name": output.name,
            "datatype": output.datatype.name,
            "shape": list(output.shape),
        }
        if output.shared_memory is not None:
            # The client reads it from its region. No "parameters" either: the C++ client
            # takes any output that has them for a binary one and asks for binary_data_size.
            pass
        elif binary:
            blob = tensor_to_bytes(output.data, output.datatype)
            entry["parameters"] = {"binary_data_size": blob.nbytes}
            blobs.append(blob)
        else:
            entry["data"] = json_codec.encode_data(output.data, output.datatype)
        outputs.append(entry)
    body: dict[str, Any] = {}
    if response.id is not None:
        body["id"] = response.id
    body["model_name"] = response.model_name
    body["model_version"] = response.model_version
    if response.parameters:
        body["parameters"] = response.parameters
    body["outputs"] = outputs
    return EncodedResponse(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), blobs)
