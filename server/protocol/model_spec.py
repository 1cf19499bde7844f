"""What a request is checked against, read once from the model config at load time.

Validation runs on every request; looking tensors up in protobuf messages (and turning enum
numbers into names) each time costs more than the check itself, so the config is flattened into
plain records when the model loads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from server.generated import model_config_pb2 as mc
from server.protocol import datatypes
from server.protocol.datatypes import DataType


@dataclass(frozen=True)
class TensorSpec:
    """One configured input or output. ``dims`` exclude the batch dimension; ``reshape`` is
    the shape the model itself sees (None when the config has no reshape)."""

    name: str
    datatype: DataType
    dims: tuple[int, ...]
    reshape: tuple[int, ...] | None
    optional: bool = False
    #: an output's labels, line by line of its ``label_filename`` (classification extension)
    labels: tuple[bytes, ...] = ()

    def client_shape(self, batching: bool) -> list[int]:
        """The shape clients see in metadata: ``[-1] + dims`` when the model batches."""
        return [-1, *self.dims] if batching else list(self.dims)


@dataclass(frozen=True)
class ModelSpec:
    """The parts of a model config that requests are validated and shaped against."""

    name: str
    max_batch_size: int
    inputs: dict[str, TensorSpec]
    outputs: dict[str, TensorSpec]
    #: ``model_transaction_policy { decoupled: true }``: zero or many responses per request
    decoupled: bool = False
    #: ``max_batch_size > 0`` (stored: it is read several times per request)
    batching: bool = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "batching", self.max_batch_size > 0)

    @classmethod
    def from_config(
        cls, config: mc.ModelConfig, labels: Mapping[str, tuple[bytes, ...]] | None = None
    ) -> ModelSpec:
        """``labels``: the outputs' label files as read at load time (output name -> lines)."""
        labels = labels or {}
        return cls(
            name=config.name,
            max_batch_size=config.max_batch_size,
            inputs={t.name: _tensor(t, t.optional) for t in config.input},
            outputs={t.name: _tensor(t, False, labels.get(t.name, ())) for t in config.output},
            decoupled=config.model_transaction_policy.decoupled,
        )


def _tensor(
    tensor: mc.ModelInput | mc.ModelOutput, optional: bool, labels: tuple[bytes, ...] = ()
) -> TensorSpec:
    reshape = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None
    return TensorSpec(
        name=tensor.name,
        datatype=datatypes.from_config_enum(tensor.data_type),
        dims=tuple(tensor.dims),
        reshape=reshape,
        optional=optional,
        labels=labels,
    )
