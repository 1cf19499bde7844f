"""Check a decoded request against its model before it reaches a backend.

Messages follow Triton's where it has them (triton-facts §1.3, §7.5). The result is what a
backend runs: input arrays reshaped as the model expects, and the output names to compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from server.errors import InvalidArgument
from server.protocol import classification
from server.protocol.datatypes import DataType
from server.protocol.model_spec import ModelSpec, TensorSpec
from server.protocol.refusals import request_refused
from server.protocol.types import InferRequest, InputTensor


@dataclass
class PreparedRequest:
    """A validated request: backend-shaped inputs, outputs to compute, and its batch size."""

    inputs: dict[str, np.ndarray]
    output_names: list[str]
    batch_size: int


def _names_text(names: list[str]) -> str:
    """A name list as Triton prints it: ['A','B']."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def _dims_text(dims: list[int] | tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


#: What Triton adds when an input's shape does not fit a batching model (whose dims leave out
#: the batch dimension); for any other model the text ends at ". ", as there.
_IMPLICIT_BATCH_NOTE = (
    "NOTE: Setting a non-zero max_batch_size in the model config requires a batch dimension to "
    "be prepended to each input shape. If you want to specify the full shape including the "
    "batch dim in your input dims config, try setting max_batch_size to zero. See the model "
    "configuration docs for more info on max_batch_size."
)


def _shape_matches(shape: tuple[int, ...], dims: tuple[int, ...]) -> bool:
    if len(shape) != len(dims):
        return False
    for size, dim in zip(shape, dims):  # a loop: no generator per check, on every input
        if dim != size and dim != -1:
            return False
    return True


def validate(request: InferRequest, spec: ModelSpec) -> PreparedRequest:
    """Validate ``request`` for the model ``spec``; raise ``InvalidArgument`` on any mistake."""
    inputs: dict[str, np.ndarray] = {}
    batch_size: int | None = None
    for tensor in request.inputs:
        if tensor.name in inputs:
            raise request_refused(request.id, f"input '{tensor.name}' already exists in request")
        rows = check_input(spec, tensor.name, tensor.datatype, tensor.shape, request.id)
        declared = spec.inputs[tensor.name]
        if rows is not None:
            if batch_size is None:
                batch_size = rows
            elif rows != batch_size:
                raise request_refused(
                    request.id,
                    f"input '{tensor.name}' batch size does not match other inputs for "
                    f"'{spec.name}'",
                )
        inputs[tensor.name] = _model_view(tensor, declared, spec)
    if len(inputs) < len(spec.inputs):
        _check_required(request, spec, inputs)
    return PreparedRequest(
        inputs=inputs,
        output_names=_output_names(request, spec),
        batch_size=batch_size if batch_size is not None else 1,
    )


def check_input(
    spec: ModelSpec,
    name: str,
    datatype: DataType,
    shape: tuple[int, ...],
    request_id: str | None,
) -> int | None:
    """Check an input's name, datatype and shape against the model; its batch size when the
    model batches. Codecs call this before decoding the data, so a wrong tensor is refused
    before any work is done on its bytes. ``request_id`` is named in the refusals, as Triton
    names it (``server.protocol.refusals``); an unknown input is refused without it, as there."""
    model = spec.name
    declared = spec.inputs.get(name)
    if declared is None:
        raise InvalidArgument(f"unexpected inference input '{name}' for model '{model}'")
    if datatype is not declared.datatype:
        raise request_refused(
            request_id,
            f"inference input '{name}' data-type is '{datatype.name}', but model "
            f"'{model}' expects '{declared.datatype.name}'",
        )
    full_dims = (-1, *declared.dims) if spec.batching else declared.dims
    rows = None
    if spec.batching:
        if not shape:
            raise request_refused(
                request_id,
                f"input '{name}' has no shape but model requires batch dimension for '{model}'",
            )
        rows = shape[0]
        if rows > spec.max_batch_size:
            raise request_refused(
                request_id,
                f"inference request batch-size must be <= {spec.max_batch_size} for '{model}'",
            )
    if not _shape_matches(shape, full_dims):
        raise request_refused(
            request_id,
            f"unexpected shape for input '{name}' for model '{model}'. Expected "
            f"{_dims_text(full_dims)}, got {_dims_text(shape)}. "
            f"{_IMPLICIT_BATCH_NOTE if spec.batching else ''}",
        )
    return rows


def _model_view(tensor: InputTensor, declared: TensorSpec, spec: ModelSpec) -> np.ndarray:
    """The input as the model sees it: the config's ``reshape`` applied (a view, no copy)."""
    if declared.reshape is None:
        return tensor.data
    # A -1 in the reshape takes whatever the element count leaves (numpy's -1).
    shape = (tensor.shape[0], *declared.reshape) if spec.batching else declared.reshape
    try:
        return tensor.data.reshape(shape)
    except ValueError:
        raise InvalidArgument(
            f"input '{tensor.name}' for model '{spec.name}' of shape "
            f"{_dims_text(tensor.shape)} cannot be reshaped to {_dims_text(declared.reshape)}"
        ) from None


def _check_required(request: InferRequest, spec: ModelSpec, given: dict[str, np.ndarray]) -> None:
    required = [name for name, t in spec.inputs.items() if not t.optional]
    missing = [name for name in required if name not in given]
    if not missing:
        return
    count = (
        f"expected {len(required)} inputs"
        if len(required) == len(spec.inputs)
        else f"expected number of inputs between {len(required)} and {len(spec.inputs)}"
    )
    got = [t.name for t in request.inputs]
    raise request_refused(
        request.id,
        f"{count} but got {len(got)} inputs for model '{spec.name}'. Got input(s) "
        f"{_names_text(got)}, but missing required input(s) {_names_text(missing)}. Please "
        "provide all required input(s).",
    )


def _output_names(request: InferRequest, spec: ModelSpec) -> list[str]:
    if not request.outputs:  # none listed (or an empty list): every output, as in Triton
        return list(spec.outputs)
    names: list[str] = []
    for output in request.outputs:
        if output.name not in spec.outputs:
            raise InvalidArgument(
                f"unexpected inference output '{output.name}' for model '{spec.name}'"
            )
        if output.name in names:
            raise request_refused(request.id, f"output '{output.name}' already exists in request")
        if classification.PARAMETER in output.parameters:  # (not for binary_data alone)
            classification.check_datatype(output, spec.outputs[output.name])
        names.append(output.name)
    return names
