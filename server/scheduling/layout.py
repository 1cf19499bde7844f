"""How a batch of requests becomes one execution's inputs, and its outputs each request's answer.

The plain case (Triton's default): requests batch only when their non-batch dims agree; inputs
are concatenated along rows and each request gets its own rows of every output.

Triton's ragged batching (triton-facts §4.1) changes three things, all from the model config:

- an input with ``allow_ragged_batch`` does not take part in the shape check, and the model
  receives it as one 1-D tensor: every request's elements, flattened and concatenated (what
  Triton's ONNX Runtime backend does, whatever the batch size);
- ``batch_input`` entries add inputs the requests do not carry, computed from the batch formed:
  element counts of a source input per request (``BATCH_ELEMENT_COUNT``), running totals
  (``BATCH_ACCUMULATED_ELEMENT_COUNT``, ``..._WITH_ZERO`` with a leading 0), a tensor shaped
  ``[largest count]`` (``BATCH_MAX_ELEMENT_COUNT_AS_SHAPE``), or every batch item's non-batch
  shape (``BATCH_ITEM_SHAPE`` ``[rows, ndim]``, ``BATCH_ITEM_SHAPE_FLATTEN`` ``[rows * ndim]``);
- a ``batch_output`` of kind ``BATCH_SCATTER_WITH_INPUT_SHAPE`` is split by the element counts
  of its source input instead of by rows, each request's part shaped as the output's config dims
  with every variable dim taken from the request's source input.

A model whose outputs do not add up to what the batch asks for fails the whole batch with a
500 naming the output: never an empty or shifted answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from server.errors import InternalError, ModelLoadError
from server.generated import model_config_pb2 as mc
from server.protocol import datatypes
from server.scheduling.job import Job

ShapeKey = tuple[tuple[str, np.dtype[Any], tuple[int, ...]], ...]

_COUNT_KINDS = (
    mc.BatchInput.BATCH_ELEMENT_COUNT,
    mc.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT,
    mc.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO,
    mc.BatchInput.BATCH_MAX_ELEMENT_COUNT_AS_SHAPE,
)
_SHAPE_KINDS = (mc.BatchInput.BATCH_ITEM_SHAPE, mc.BatchInput.BATCH_ITEM_SHAPE_FLATTEN)
_BATCH_INPUT_TYPES = (mc.TYPE_INT32, mc.TYPE_INT64, mc.TYPE_FP32)


@dataclass(frozen=True)
class BatchInputSpec:
    """One ``batch_input`` entry."""

    kind: int
    targets: tuple[str, ...]
    dtype: np.dtype
    source: str


@dataclass(frozen=True)
class ScatterOutput:
    """One ``batch_output`` target: split like ``source`` and shaped from the config dims."""

    source: str
    dims: tuple[int, ...]  # the output's config dims (without the batch dim); -1 = from source


class BatchLayout:
    """Gathers a batch's inputs and scatters its outputs for one model."""

    def __init__(
        self,
        ragged: frozenset[str] = frozenset(),
        batch_inputs: Sequence[BatchInputSpec] = (),
        scatter_outputs: Mapping[str, ScatterOutput] | None = None,
    ) -> None:
        self.ragged = ragged
        self.batch_inputs = tuple(batch_inputs)
        self.scatter_outputs = dict(scatter_outputs or {})

    @classmethod
    def from_config(cls, config: mc.ModelConfig) -> BatchLayout:
        """The layout a validated config asks for (see ``validate_config``)."""
        outputs = {tensor.name: tensor for tensor in config.output}
        return cls(
            frozenset(t.name for t in config.input if t.allow_ragged_batch),
            [
                BatchInputSpec(
                    entry.kind,
                    tuple(entry.target_name),
                    datatypes.from_config_enum(entry.data_type).dtype,
                    entry.source_input[0],
                )
                for entry in config.batch_input
            ],
            {
                target: ScatterOutput(entry.source_input[0], _config_dims(outputs[target]))
                for entry in config.batch_output
                for target in entry.target_name
            },
        )

    @property
    def plain(self) -> bool:
        """No ragged input, batch input or batch output: rows in, rows out."""
        return not (self.ragged or self.batch_inputs or self.scatter_outputs)

    def shape_key(self, job: Job) -> ShapeKey:
        """Requests batch together only with the same inputs (optional ones included), of the
        same dtypes and, except for ragged inputs, the same non-batch dims. (Made for every
        batched request: a loop, not a generator, and dtypes as they are, not their names,
        took 1.0 µs to 0.4 µs.)"""
        key = []
        for name in sorted(job.inputs):
            array = job.inputs[name]
            key.append((name, array.dtype, () if name in self.ragged else array.shape[1:]))
        return tuple(key)

    # --- inputs ----------------------------------------------------------------------------

    def gather_parts(self, jobs: Sequence[Job]) -> dict[str, list[np.ndarray]]:
        """The execution's inputs as parts which, joined along their first axis, are the
        tensors the model receives: each request's rows (a ragged input's elements, flattened),
        and every batch input as one part. Only views: nothing is copied here."""
        parts: dict[str, list[np.ndarray]] = {}
        for name in jobs[0].inputs:
            pieces = [job.inputs[name] for job in jobs]
            parts[name] = [p.reshape(-1) for p in pieces] if name in self.ragged else pieces
        for spec in self.batch_inputs:
            value = _batch_input(spec, [job.inputs[spec.source] for job in jobs])
            for target in spec.targets:
                parts[target] = [value]
        return parts

    def gather(self, jobs: Sequence[Job], buffers: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The execution's inputs, joined on the host. Rows of several requests are
        concatenated into ``buffers`` (reused from one batch to the next, grown when too small);
        a plain batch of one passes its arrays through untouched, a ragged input of one request
        is a flat view of it."""
        if len(jobs) == 1 and self.plain:
            return dict(jobs[0].inputs)
        gathered: dict[str, np.ndarray] = {}
        for name, parts in self.gather_parts(jobs).items():
            first = parts[0]
            if len(parts) == 1:
                gathered[name] = first
                continue
            shape = (sum(part.shape[0] for part in parts), *first.shape[1:])
            # BYTES (object) buffers are made per batch: a reused one would keep earlier
            # batches' strings alive in its unused rows.
            out = (
                np.empty(shape, dtype=object)
                if first.dtype == object
                else _buffer(buffers, name, first.dtype, shape)
            )
            np.concatenate(parts, axis=0, out=out)
            gathered[name] = out
        return gathered

    # --- outputs ---------------------------------------------------------------------------

    def scatter(
        self, model: str, jobs: Sequence[Job], outputs: Mapping[str, np.ndarray]
    ) -> list[dict[str, np.ndarray]]:
        """Each request's part of the outputs (only the outputs it asked for), as views."""
        if len(jobs) == 1 and self.plain:
            return [{name: outputs[name] for name in jobs[0].output_names}]
        rows = [job.rows for job in jobs]
        parts: dict[str, list[np.ndarray]] = {}
        for name, value in outputs.items():
            scatter = self.scatter_outputs.get(name)
            if scatter is None:
                parts[name] = _split_rows(model, name, value, rows)
            else:
                shapes = [_scattered_shape(scatter, job.inputs[scatter.source]) for job in jobs]
                parts[name] = _split_elements(model, name, value, shapes)
        return [
            {name: parts[name][index] for name in job.output_names}
            for index, job in enumerate(jobs)
        ]


def validate_config(config: mc.ModelConfig) -> None:
    """Refuse ``allow_ragged_batch``, ``batch_input`` and ``batch_output`` settings this layout
    cannot honour, with a message naming the entry."""
    name = config.name
    inputs = {tensor.name: tensor for tensor in config.input}
    outputs = {tensor.name for tensor in config.output}
    uses_ragged = any(t.allow_ragged_batch for t in config.input)
    if (uses_ragged or config.batch_input or config.batch_output) and config.max_batch_size < 1:
        raise ModelLoadError(
            f"model '{name}': allow_ragged_batch, batch_input and batch_output need "
            "max_batch_size > 0"
        )
    targets: set[str] = set()
    for entry in config.batch_input:
        kind = mc.BatchInput.Kind.Name(entry.kind)
        if len(entry.source_input) != 1 or entry.source_input[0] not in inputs:
            raise ModelLoadError(
                f"batch input kind '{kind}' of model '{name}' expects 1 source input that is one "
                f"of the model inputs, got {list(entry.source_input)}"
            )
        if inputs[entry.source_input[0]].optional:
            raise ModelLoadError(
                f"batch input kind '{kind}' of model '{name}' takes its values from optional "
                f"input '{entry.source_input[0]}', which a request may leave out"
            )
        if not entry.target_name:
            raise ModelLoadError(f"batch input kind '{kind}' of model '{name}' has no target_name")
        for target in entry.target_name:
            if target in inputs or target in targets:
                raise ModelLoadError(
                    f"batch input target '{target}' of model '{name}' is already an input"
                )
            targets.add(target)
        if entry.data_type not in _BATCH_INPUT_TYPES:
            raise ModelLoadError(
                f"batch input kind '{kind}' of model '{name}' must have data_type TYPE_INT32, "
                f"TYPE_INT64 or TYPE_FP32, not {mc.DataType.Name(entry.data_type)}"
            )
        if entry.kind not in _COUNT_KINDS + _SHAPE_KINDS:
            raise ModelLoadError(f"batch input of model '{name}' has unknown kind {entry.kind}")
    for output in config.batch_output:
        if len(output.source_input) != 1 or output.source_input[0] not in inputs:
            raise ModelLoadError(
                f"batch output of model '{name}' expects 1 source input that is one of the model "
                f"inputs, got {list(output.source_input)}"
            )
        for target in output.target_name:
            if target not in outputs:
                raise ModelLoadError(
                    f"batch output target '{target}' of model '{name}' is not a model output"
                )


# --- helpers --------------------------------------------------------------------------------


def _config_dims(tensor: mc.ModelOutput) -> tuple[int, ...]:
    return tuple(tensor.reshape.shape if tensor.HasField("reshape") else tensor.dims)


def _buffer(
    buffers: dict[str, np.ndarray], name: str, dtype: np.dtype, shape: tuple[int, ...]
) -> np.ndarray:
    """A view of ``shape`` on the reused buffer for ``name``, reallocated when it cannot hold
    it (other dtype or trailing dims, or too few leading entries)."""
    buffer = buffers.get(name)
    if (
        buffer is None
        or buffer.dtype != dtype
        or buffer.shape[1:] != shape[1:]
        or buffer.shape[0] < shape[0]
    ):
        capacity = shape[0] if buffer is None else max(shape[0], buffer.shape[0])
        buffer = np.empty((capacity, *shape[1:]), dtype=dtype)
        buffers[name] = buffer
    return buffer[: shape[0]]


def _batch_input(spec: BatchInputSpec, sources: Sequence[np.ndarray]) -> np.ndarray:
    """One batch input's value for requests whose ``spec.source`` inputs are ``sources``."""
    kind = spec.kind
    if kind in _SHAPE_KINDS:
        shapes = [item.shape[1:] for item in sources for _ in range(item.shape[0])]
        width = len(sources[0].shape) - 1
        value = np.array(shapes, dtype=spec.dtype).reshape(len(shapes), width)
        return value.reshape(-1) if kind == mc.BatchInput.BATCH_ITEM_SHAPE_FLATTEN else value
    counts = np.array([item.size for item in sources], dtype=np.int64)
    if kind == mc.BatchInput.BATCH_ELEMENT_COUNT:
        return counts.astype(spec.dtype)
    if kind == mc.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT:
        return np.cumsum(counts).astype(spec.dtype)
    if kind == mc.BatchInput.BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO:
        return np.concatenate([[0], np.cumsum(counts)]).astype(spec.dtype)
    # BATCH_MAX_ELEMENT_COUNT_AS_SHAPE: only the shape carries information.
    return np.zeros(int(counts.max()), dtype=spec.dtype)


def _split_rows(model: str, name: str, value: np.ndarray, rows: Sequence[int]) -> list[np.ndarray]:
    total = sum(rows)
    got = value.shape[0] if value.ndim else 0
    if got != total:
        raise InternalError(
            f"model '{model}' returned output '{name}' with {got} rows for a batch of {total}"
        )
    if len(rows) == 1:
        return [value]
    parts = []
    start = 0
    for count in rows:  # plain ints: np.cumsum and numpy-scalar slices cost more per batch
        parts.append(value[start : start + count])
        start += count
    return parts


def _scattered_shape(scatter: ScatterOutput, source: np.ndarray) -> tuple[int, ...]:
    """A request's part of a scattered output: its rows, then the config dims with each
    variable dim taken from the same dim of the request's source input."""
    dims = [
        source.shape[index + 1] if dim == -1 and index + 1 < source.ndim else dim
        for index, dim in enumerate(scatter.dims)
    ]
    return (source.shape[0], *dims)


def _split_elements(
    model: str, name: str, value: np.ndarray, shapes: Sequence[tuple[int, ...]]
) -> list[np.ndarray]:
    flat = value.reshape(-1)
    sizes = [math.prod(shape) for shape in shapes]
    if flat.size != sum(sizes) or any(dim < 0 for shape in shapes for dim in shape):
        raise InternalError(
            f"model '{model}' returned output '{name}' with {flat.size} elements where the "
            f"batch's source inputs call for {sum(sizes)}"
        )
    parts = []
    offset = 0
    for shape, size in zip(shapes, sizes):
        parts.append(flat[offset : offset + size].reshape(shape))
        offset += size
    return parts
