"""The requests a config's ``model_warmup`` samples make, built before any instance runs them.

Triton (``GenerateWarmupData``) turns each sample into ``batch_size`` identical single-entry
requests: every input shaped ``[1] + dims`` when the model batches, else ``dims``, holding zeros
(``zero_data``), random bytes (``random_data``; zeros for TYPE_STRING) or the raw row-major
bytes of ``warmup/<input_data_file>`` in the model folder (TYPE_STRING: 4-byte little-endian
length-prefixed elements). A sample of ``batch_size: 0`` is skipped; ``count: 0`` runs once.
Every mistake in a sample fails the load, so the data are built, and checked, once per model
version rather than once per instance.
"""

from __future__ import annotations

import logging
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from server.errors import InvalidArgument, ModelLoadError
from server.generated import model_config_pb2 as mc
from server.protocol.datatypes import DataType, from_config_enum
from server.protocol.types import InferRequest, InputTensor
from server.repository.paths import confined_file

log = logging.getLogger(__name__)

#: Where ``input_data_file`` names are looked up, relative to the model folder (as in Triton).
WARMUP_FOLDER = "warmup"
#: How a warmup load failure's reason starts: Triton reports its INVALID_ARG status text.
REASON_PREFIX = "Invalid argument: "


@dataclass(frozen=True)
class WarmupSample:
    """One sample: its name, the request each of its ``batch_size`` entries sends, and how many
    executions (``count``, at least one) run those entries together."""

    name: str
    request: InferRequest
    batch_size: int
    count: int


def warmup_failure(message: str) -> ModelLoadError:
    """A load failure of warmup, worded as Triton's status for it."""
    return ModelLoadError(REASON_PREFIX + message)


def build_samples(
    config: mc.ModelConfig, model_dir: Path, rng: np.random.Generator | None = None
) -> list[WarmupSample]:
    """The samples of ``config.model_warmup`` to run, in order (``batch_size: 0`` left out);
    raises ``ModelLoadError`` for a sample that cannot be built."""
    samples = []
    random = rng if rng is not None else np.random.default_rng()
    for setting in config.model_warmup:
        if setting.batch_size == 0:
            log.debug("skipping warmup sample '%s': batch_size is 0", setting.name)
            continue
        log.debug("Generating warmup sample data for '%s'", setting.name)
        inputs = [
            _input(config, model_dir, name, setting.inputs[name], random)
            for name in sorted(setting.inputs)
        ]
        request = InferRequest(config.name, "", inputs)
        samples.append(
            WarmupSample(setting.name, request, setting.batch_size, max(setting.count, 1))
        )
    return samples


def _input(
    config: mc.ModelConfig,
    model_dir: Path,
    name: str,
    setting: mc.ModelWarmup.Input,
    rng: np.random.Generator,
) -> InputTensor:
    if any(dim < 0 for dim in setting.dims):
        raise warmup_failure(
            f"warmup setting expects all variable-size dimensions are specified for input "
            f"'{name}'"
        )
    kind = setting.WhichOneof("input_data_type")
    if kind is None:
        raise warmup_failure(f"warmup setting expects input '{name}' to have input_data_type set")
    try:
        datatype = from_config_enum(setting.data_type)
    except InvalidArgument as exc:
        raise warmup_failure(f"warmup setting of input '{name}': {exc.message}") from None
    shape = (1, *setting.dims) if config.max_batch_size > 0 else tuple(setting.dims)
    elements = int(np.prod(shape, dtype=np.int64))
    if kind == "input_data_file":
        data = _from_file(config, model_dir, name, setting.input_data_file, datatype, elements)
    elif kind == "random_data" and not datatype.is_bytes:
        data = _random(datatype, elements, rng)
    else:  # zero_data, or random_data of TYPE_STRING (zeros in Triton too)
        data = _zeros(datatype, elements)
    return InputTensor(name, datatype, shape, data.reshape(shape))


def _zeros(datatype: DataType, elements: int) -> np.ndarray:
    if datatype.is_bytes:  # a zero length prefix per element: empty strings
        data = np.empty(elements, dtype=object)
        data.fill(b"")
        return data
    return np.zeros(elements, dtype=datatype.dtype)


def _random(datatype: DataType, elements: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes, as Triton's; BOOL elements are kept 0 or 1 so that they stay booleans."""
    if datatype.dtype == np.bool_:
        return rng.integers(0, 2, elements, dtype=np.uint8).astype(np.bool_)
    raw = rng.integers(0, 256, elements * datatype.itemsize, dtype=np.uint8)
    return raw.view(datatype.dtype)


def _from_file(
    config: mc.ModelConfig,
    model_dir: Path,
    name: str,
    filename: str,
    datatype: DataType,
    elements: int,
) -> np.ndarray:
    label = f"{WARMUP_FOLDER}/{filename}"
    path = confined_file(
        model_dir / WARMUP_FOLDER, filename, f"input_data_file of warmup input '{name}'",
        config.name, label, "the model's warmup folder",
    )
    if path is None:
        raise warmup_failure(
            f"warmup setting of input '{name}' names input_data_file '{label}', which does not "
            f"exist in model '{config.name}'"
        )
    raw = path.read_bytes()
    if datatype.is_bytes:
        return _strings(raw, elements, filename)
    needed = elements * datatype.itemsize
    if len(raw) < needed:
        raise warmup_failure(
            f"warmup setting expects {needed} bytes, but the data provided from {filename}only "
            f"has {len(raw)} bytes"
        )
    return np.frombuffer(raw, dtype=datatype.dtype, count=elements).copy()


def _strings(raw: bytes, elements: int, filename: str) -> np.ndarray:
    """``elements`` length-prefixed strings from the start of ``raw``."""
    data = np.empty(elements, dtype=object)
    offset = 0
    for index in range(elements):
        if offset + 4 > len(raw):
            raise _short_strings(elements, index, filename)
        (length,) = struct.unpack_from("<I", raw, offset)
        offset += 4
        if offset + length > len(raw):
            raise _short_strings(elements, index, filename)
        data[index] = raw[offset : offset + length]
        offset += length
    return data


def _short_strings(elements: int, found: int, filename: str) -> ModelLoadError:
    return warmup_failure(
        f"warmup setting expects {elements} string elements, but the data provided from "
        f"{filename} only has {found} complete ones"
    )
