"""Check a decoded request against its model's config before it reaches a backend.

Messages follow Triton's where it has them (triton-facts §1.3, §7.5). The result is what a
backend runs: input arrays reshaped as the model expects, and the output names to compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from server.errors import InvalidArgument
from server.generated import model_config_pb2 as mc
from server.protocol import datatypes
from server.protocol.types import InferRequest


@dataclass
class PreparedRequest:
    """A validated request: backend-shaped inputs, outputs to compute, and its batch size."""

    inputs: dict[str, np.ndarray]
    output_names: list[str]
    batch_size: int


def _names_text(names: list[str]) -> str:
    """A name list as Triton prints it: ['A','B']."""
    return "[" + ",".join(f"'{name}'" for name in names) + "]"


def _dims_text(dims: list[int]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _shape_matches(shape: tuple[int, ...], dims: list[int]) -> bool:
    return len(shape) == len(dims) and all(d == -1 or d == s for s, d in zip(shape, dims))


def _model_shape(shape: tuple[int, ...], tensor: mc.ModelInput, batching: bool) -> tuple[int, ...]:
    """The shape the model sees: the config's ``reshape`` applied to the non-batch dims."""
    if not tensor.HasField("reshape"):
        return shape
    # A -1 in the reshape takes whatever the element count leaves (numpy's -1).
    target = tuple(tensor.reshape.shape)
    return (shape[0], *target) if batching else target


def validate(request: InferRequest, config: mc.ModelConfig) -> PreparedRequest:
    """Validate ``request`` for the model ``config``; raise ``InvalidArgument`` on any mistake."""
    model = config.name
    declared = {tensor.name: tensor for tensor in config.input}
    batching = config.max_batch_size > 0
    seen: set[str] = set()
    inputs: dict[str, np.ndarray] = {}
    batch_size: int | None = None
    for tensor in request.inputs:
        if tensor.name in seen:
            raise InvalidArgument(f"input '{tensor.name}' already exists in request")
        seen.add(tensor.name)
        spec = declared.get(tensor.name)
        if spec is None:
            raise InvalidArgument(f"unexpected inference input '{tensor.name}' for model '{model}'")
        expected = datatypes.from_config_name(mc.DataType.Name(spec.data_type))
        if tensor.datatype is not expected:
            raise InvalidArgument(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype.name}', but model "
                f"'{model}' expects '{expected.name}'"
            )
        dims = list(spec.dims)
        full_dims = [-1, *dims] if batching else dims
        if batching:
            if not tensor.shape:
                raise InvalidArgument(
                    f"inference input '{tensor.name}' for model '{model}' must have a batch "
                    "dimension: the model has max_batch_size > 0"
                )
            rows = tensor.shape[0]
            if rows > config.max_batch_size:
                raise InvalidArgument(
                    f"inference request batch-size must be <= {config.max_batch_size} for "
                    f"'{model}'"
                )
            if batch_size is None:
                batch_size = rows
            elif rows != batch_size:
                raise InvalidArgument(
                    f"inference input '{tensor.name}' batch size {rows} does not match the batch "
                    f"size {batch_size} of the other inputs for model '{model}'"
                )
        if not _shape_matches(tensor.shape, full_dims):
            raise InvalidArgument(
                f"unexpected shape for input '{tensor.name}' for model '{model}'. Expected "
                f"{_dims_text(full_dims)}, got {_dims_text(list(tensor.shape))}"
            )
        data = tensor.data
        model_shape = _model_shape(tensor.shape, spec, batching)
        if model_shape != tensor.shape:
            try:
                data = data.reshape(model_shape)
            except ValueError:
                raise InvalidArgument(
                    f"input '{tensor.name}' for model '{model}' of shape "
                    f"{_dims_text(list(tensor.shape))} cannot be reshaped to "
                    f"{_dims_text(list(spec.reshape.shape))}"
                ) from None
        inputs[tensor.name] = data
    required = [t.name for t in config.input if not t.optional]
    missing = [name for name in required if name not in seen]
    if missing:
        optional = len(config.input) - len(required)
        count = (
            f"expected {len(required)} inputs"
            if optional == 0
            else f"expected number of inputs between {len(required)} and {len(config.input)}"
        )
        got = [t.name for t in request.inputs]
        raise InvalidArgument(
            f"{count} but got {len(got)} inputs for model '{model}'. Got input(s) "
            f"{_names_text(got)}, but missing required input(s) {_names_text(missing)}. Please "
            "provide all required input(s)."
        )
    return PreparedRequest(
        inputs=inputs,
        output_names=_output_names(request, config),
        batch_size=batch_size if batch_size is not None else 1,
    )


def _output_names(request: InferRequest, config: mc.ModelConfig) -> list[str]:
    if request.outputs is None:
        return [tensor.name for tensor in config.output]
    known = {tensor.name for tensor in config.output}
    names: list[str] = []
    for output in request.outputs:
        if output.name not in known:
            raise InvalidArgument(
                f"unexpected inference output '{output.name}' for model '{config.name}'"
            )
        if output.name in names:
            raise InvalidArgument(f"output '{output.name}' already exists in request")
        names.append(output.name)
    return names
