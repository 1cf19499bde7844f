"""The input tensors of the request the sweep sends: made from the model's metadata (random or
zero values) or read from a JSON or ``.npz`` file, shaped for ``--batch-size`` rows.

Shapes follow Triton's rules: for a model with ``max_batch_size > 0`` the metadata shape is
``[-1] + dims`` and the first dimension is the batch; ``--shape NAME:d1,d2`` gives the dims
(without the batch) of an input whose dims are variable (``-1``), as perf_analyzer's does.
"""

from __future__ import annotations

import json
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from server.errors import InvalidArgument
from server.loadtest.errors import BenchError, UsageError
from server.protocol import datatypes
from server.protocol.datatypes import DataType
from server.protocol.shapes import element_count

_BYTES_ALPHABET = np.frombuffer((string.ascii_letters + string.digits).encode(), np.uint8)
_BYTES_MAX_LENGTH = 16
_INTEGER_HIGH = 64  # random integers in [0, 64): valid for every integer type and as indices


@dataclass(frozen=True)
class TensorSpec:
    """One input or output as the model metadata declares it."""

    name: str
    datatype: str  # V2 name
    shape: tuple[int, ...]  # -1 for a variable dimension


@dataclass(frozen=True)
class ModelInfo:
    """What the sweep needs to know about the model: metadata plus ``max_batch_size``."""

    name: str
    version: str  # "" lets the server choose
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    max_batch_size: int

    @property
    def batching(self) -> bool:
        return self.max_batch_size > 0

    def row_dims(self, spec: TensorSpec) -> tuple[int, ...]:
        """The dims of one row: without the batch dimension when the model batches."""
        return spec.shape[1:] if self.batching else spec.shape


@dataclass(frozen=True)
class Tensor:
    """A named input with its V2 datatype and values, ready to encode."""

    name: str
    datatype: DataType
    array: np.ndarray


@dataclass(frozen=True)
class RequestInputs:
    """The inputs of the one request the sweep sends, and how many rows it carries."""

    tensors: tuple[Tensor, ...]
    rows: int


def parse_shape_option(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME:d1,d2,...`` (perf_analyzer's form) into the name and positive dims."""
    name, sep, dims_text = text.rpartition(":")
    try:
        dims = tuple(int(d) for d in dims_text.split(",")) if dims_text else ()
    except ValueError:
        dims = (0,)
    if not sep or not name or not dims or min(dims) < 1:
        raise UsageError(f"invalid --shape {text!r}: expected NAME:d1,d2,... with positive dims")
    return name, dims


def _datatype(spec: TensorSpec) -> DataType:
    try:
        return datatypes.from_name(spec.datatype)
    except InvalidArgument:
        raise BenchError(
            f"input {spec.name} has datatype {spec.datatype!r}, which is not a V2 datatype"
        ) from None


def _check_batch(model: ModelInfo, batch_size: int) -> None:
    if batch_size < 1:
        raise UsageError(f"--batch-size must be at least 1, not {batch_size}")
    if not model.batching and batch_size > 1:
        raise UsageError(
            f"model {model.name} does not batch (max_batch_size 0): --batch-size must be 1"
        )
    if model.batching and batch_size > model.max_batch_size:
        raise UsageError(
            f"--batch-size {batch_size} is over model {model.name}'s max_batch_size "
            f"{model.max_batch_size}"
        )


def _check_shape_names(model: ModelInfo, shapes: Mapping[str, tuple[int, ...]]) -> None:
    names = {spec.name for spec in model.inputs}
    unknown = sorted(set(shapes) - names)
    if unknown:
        raise UsageError(
            f"--shape names {', '.join(unknown)}, not an input of {model.name} "
            f"(inputs: {', '.join(sorted(names))})"
        )


def row_shape(
    model: ModelInfo, spec: TensorSpec, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[int, ...]:
    """The dims of one row of ``spec``: the declared ones, with ``--shape`` for variable dims."""
    declared = model.row_dims(spec)
    given = shapes.get(spec.name)
    if given is None:
        if any(d < 0 for d in declared):
            raise UsageError(
                f"input {spec.name} of {model.name} has variable dims {list(declared)}: give its "
                f"shape (without the batch dimension) with --shape {spec.name}:"
                + ",".join("16" if d < 0 else str(d) for d in declared)
            )
        return declared
    if len(given) != len(declared) or any(
        d >= 0 and d != g for d, g in zip(declared, given, strict=True)
    ):
        raise UsageError(
            f"--shape {spec.name}:{','.join(map(str, given))} does not fit the dims "
            f"{list(declared)} that {model.name} declares"
            + (" (give them without the batch dimension)" if model.batching else "")
        )
    return given


def _random_values(datatype: DataType, shape: tuple[int, ...], rng: np.random.Generator) -> Any:
    count = element_count(shape)
    if datatype.is_bytes:
        lengths = rng.integers(1, _BYTES_MAX_LENGTH + 1, count)
        values = np.empty(count, dtype=object)
        values[:] = [
            _BYTES_ALPHABET[rng.integers(0, len(_BYTES_ALPHABET), n)].tobytes() for n in lengths
        ]
        return values.reshape(shape)
    if datatype.name == "BOOL":
        return rng.integers(0, 2, shape).astype(np.bool_)
    if datatype.dtype.kind in "iu":
        return rng.integers(0, _INTEGER_HIGH, shape).astype(datatype.dtype)
    return rng.random(shape, dtype=np.float32).astype(datatype.dtype)


def _zero_values(datatype: DataType, shape: tuple[int, ...]) -> Any:
    if datatype.is_bytes:
        values = np.empty(shape, dtype=object)
        values.fill(b"")
        return values
    return np.zeros(shape, dtype=datatype.dtype)


def generate_inputs(
    model: ModelInfo,
    kind: str,
    batch_size: int,
    shapes: Mapping[str, tuple[int, ...]],
    seed: int = 0,
) -> RequestInputs:
    """Every input of ``model`` filled with ``kind`` values (``random`` or ``zero``):
    random integers in [0, 64), floats in [0, 1), booleans, or BYTES of 1 to 16 letters."""
    _check_batch(model, batch_size)
    _check_shape_names(model, shapes)
    rng = np.random.default_rng(seed)
    tensors = []
    for spec in model.inputs:
        datatype = _datatype(spec)
        shape = row_shape(model, spec, shapes)
        if model.batching:
            shape = (batch_size, *shape)
        if kind == "random":
            array = _random_values(datatype, shape, rng)
        elif kind == "zero":
            array = _zero_values(datatype, shape)
        else:
            raise UsageError(f"unknown --input-data kind {kind!r}")
        tensors.append(Tensor(spec.name, datatype, array))
    return RequestInputs(tuple(tensors), batch_size if model.batching else 1)


# --- from a file ------------------------------------------------------------------------------


def read_data_file(path: Path) -> dict[str, Any]:
    """The name → values mapping of a JSON or ``.npz`` file.

    JSON takes ``{"INPUT0": [...]}``, ``{"INPUT0": {"content": [...], "shape": [...]}}`` or
    perf_analyzer's ``{"data": [{...}, ...]}`` (its first entry; values nested or flat).
    """
    if not path.is_file():
        raise UsageError(f"--input-data {path}: no such file")
    if path.suffix == ".npz":
        try:
            with np.load(path, allow_pickle=False) as archive:
                return {name: archive[name] for name in archive.files}
        except (OSError, ValueError) as exc:
            raise BenchError(f"cannot read {path} as .npz: {exc}") from None
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BenchError(f"cannot read {path} as JSON: {exc}") from None
    if isinstance(document, dict) and isinstance(document.get("data"), list):
        entries = document["data"]
        if not entries:
            raise BenchError(f'{path}: "data" has no entries')
        document = entries[0]
    if not isinstance(document, dict):
        raise BenchError(f"{path}: expected a JSON object of input name → values")
    return document


def _as_array(name: str, value: Any, datatype: DataType, source: str) -> np.ndarray:
    shape = None
    if isinstance(value, dict):
        if "content" not in value:
            raise BenchError(f'{source}: input {name} is an object without "content"')
        shape, value = value.get("shape"), value["content"]
    try:
        if datatype.is_bytes:
            raw = np.asarray(value, dtype=object)
            array = np.empty(raw.shape, dtype=object)
            array.reshape(-1)[:] = [
                v if isinstance(v, bytes) else str(v).encode("utf-8") for v in raw.reshape(-1)
            ]
        else:
            array = np.asarray(value, dtype=datatype.dtype)
        if shape is not None:
            array = array.reshape([int(d) for d in shape])
    except (TypeError, ValueError, OverflowError) as exc:
        raise BenchError(f"{source}: input {name} cannot be {datatype.name}: {exc}") from None
    return array


def _fixed_dims_fit(dims: Sequence[int], shape: Sequence[int]) -> bool:
    return len(dims) == len(shape) and all(
        d < 0 or d == s for d, s in zip(dims, shape, strict=True)
    )


def inputs_from_data(
    model: ModelInfo,
    data: Mapping[str, Any],
    source: str,
    batch_size: int | None,
    shapes: Mapping[str, tuple[int, ...]],
) -> RequestInputs:
    """Tensors from file data. A value of one row's rank is one row, repeated for
    ``--batch-size`` rows; a value with the batch dimension is used as it is (its rows must then
    agree with ``--batch-size`` when given). A flat list is reshaped to the declared dims
    (with ``--shape`` for variable ones)."""
    _check_batch(model, batch_size or 1)
    _check_shape_names(model, shapes)
    names = [spec.name for spec in model.inputs]
    unknown = sorted(set(data) - set(names))
    missing = [name for name in names if name not in data]
    if unknown or missing:
        raise BenchError(
            f"{source} does not match the inputs of {model.name} ({', '.join(names)}): "
            + "; ".join(
                part
                for part in (
                    f"missing {', '.join(missing)}" if missing else "",
                    f"unknown {', '.join(unknown)}" if unknown else "",
                )
                if part
            )
        )
    arrays: dict[str, tuple[DataType, np.ndarray]] = {}
    rows_seen: dict[str, int] = {}
    for spec in model.inputs:
        datatype = _datatype(spec)
        array = _as_array(spec.name, data[spec.name], datatype, source)
        dims = model.row_dims(spec)
        if array.ndim == 1 and len(dims) != 1:
            array = _reshape_flat(model, spec, array, batch_size, shapes, source)
        if model.batching and array.ndim == len(dims) + 1:
            rows_seen[spec.name] = array.shape[0]
            row = array.shape[1:]
        else:
            row = array.shape
        if not _fixed_dims_fit(dims, row):
            raise BenchError(
                f"{source}: input {spec.name} has shape {list(array.shape)}, which does not fit "
                f"the dims {list(spec.shape)} that {model.name} declares"
            )
        arrays[spec.name] = (datatype, array)
    rows = _agreed_rows(rows_seen, batch_size, source)
    _check_batch(model, rows)
    tensors = []
    for name, (datatype, array) in arrays.items():
        if model.batching and name not in rows_seen:
            array = np.repeat(array[np.newaxis], rows, axis=0)
        tensors.append(Tensor(name, datatype, array))
    return RequestInputs(tuple(tensors), rows if model.batching else 1)


def _reshape_flat(
    model: ModelInfo,
    spec: TensorSpec,
    array: np.ndarray,
    batch_size: int | None,
    shapes: Mapping[str, tuple[int, ...]],
    source: str,
) -> np.ndarray:
    row = row_shape(model, spec, shapes)
    per_row = element_count(row)
    if array.size == per_row:
        return array.reshape(row)
    rows = array.size // per_row if per_row else 0
    fits = model.batching and rows >= 1 and rows * per_row == array.size
    if fits and (batch_size is None or batch_size == rows):
        return array.reshape((rows, *row))
    raise BenchError(
        f"{source}: input {spec.name} has {array.size} values, which do not make "
        f"{'rows ' if model.batching else ''}of shape {list(row)}"
    )


def _agreed_rows(rows_seen: Mapping[str, int], batch_size: int | None, source: str) -> int:
    counts = set(rows_seen.values())
    if len(counts) > 1:
        raise BenchError(
            f"{source}: the inputs have different batch sizes "
            + ", ".join(f"{n}: {r}" for n, r in rows_seen.items())
        )
    if not counts:
        return batch_size or 1
    rows = counts.pop()
    if batch_size is not None and batch_size != rows:
        raise UsageError(f"{source} holds {rows} rows per input but --batch-size is {batch_size}")
    return rows
