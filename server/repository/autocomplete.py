"""Complete a missing or partial config from the model file, as Triton's ONNX Runtime backend.

Rules (triton-facts §3.4): a config that already has an input and an output is left alone. A
model can batch when every input and output has a variable leading dimension; then a missing
``max_batch_size`` becomes the backend's default (4) and ``dynamic_batching {}`` is added when no
scheduler is set. Missing tensors are added with the model's names, types and dims (without the
batch dimension when batching).
"""

from __future__ import annotations

import logging
from typing import cast

from backends.base import ModelSignature, TensorInfo
from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.protocol import sequence_spec

log = logging.getLogger(__name__)


def _can_batch(signature: ModelSignature) -> bool:
    tensors = signature.inputs + signature.outputs
    return bool(tensors) and all(t.shape and t.shape[0] == -1 for t in tensors)


def is_complete(config: mc.ModelConfig) -> bool:
    """A config with an input and an output is left alone (and its model file not read)."""
    return bool((config.input or config.batch_input) and config.output)


def autocomplete(config: mc.ModelConfig, signature: ModelSignature, default_max_batch: int) -> None:
    """Fill ``config`` in place from ``signature``."""
    if is_complete(config):
        return
    can_batch = _can_batch(signature)
    if can_batch:
        if config.max_batch_size == 0 and default_max_batch > 0:
            log.warning(
                "autofilled max_batch_size to %d for model '%s' since batching is supported but "
                "no max_batch_size is specified in model configuration. Must specify "
                "max_batch_size to utilize autofill with a larger max batch size",
                default_max_batch,
                config.name,
            )
            config.max_batch_size = default_max_batch
        if config.max_batch_size > 1 and config.WhichOneof("scheduling_choice") is None:
            config.dynamic_batching.SetInParent()
    elif config.max_batch_size != 0:
        raise ModelLoadError(
            f"autofill failed for model '{config.name}': model does not support batching while "
            "non-zero max_batch_size is specified"
        )
    batching = config.max_batch_size > 0
    # The sequence batcher's control and state tensors are the model's, not the clients'.
    supplied_inputs = sequence_spec.supplied_inputs(config)
    supplied_outputs = sequence_spec.supplied_outputs(config)
    if not (config.input or config.batch_input):
        for info in signature.inputs:
            if info.name not in supplied_inputs:
                _fill_tensor(config.input.add(), info, batching)
    if not config.output:
        for info in signature.outputs:
            if info.name not in supplied_outputs:
                _fill_tensor(config.output.add(), info, batching)


def _fill_tensor(tensor: mc.ModelInput | mc.ModelOutput, info: TensorInfo, batching: bool) -> None:
    tensor.name = info.name
    tensor.data_type = cast(mc.DataType, mc.DataType.Value(info.datatype.config_name))
    dims = list(info.shape[1:] if batching else info.shape)
    if dims:
        tensor.dims.extend(dims)
    else:
        # A scalar (per batch row) is declared as [1] and reshaped to the model's empty shape.
        tensor.dims.append(1)
        tensor.reshape.SetInParent()
