"""Ensemble configs: what Triton checks, with Triton's messages, and the plan they become.

Two stages, as in Triton. ``validate_structure`` needs only the ensemble's own config (the
graph's data flow: every output written, every tensor used); it runs when the config is read.
``link`` needs the composing models' completed configs (maps name real tensors, datatypes and
shapes agree between producer and consumer, batch sizes fit); it runs once they are loaded.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NoReturn

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.scheduling.ensemble import EnsemblePlan, EnsembleStep

ENSEMBLE_PLATFORM = "ensemble"


def is_ensemble(config: mc.ModelConfig) -> bool:
    return config.platform == ENSEMBLE_PLATFORM


def composing_models(config: mc.ModelConfig) -> list[tuple[str, int]]:
    """``(model name, version)`` of every step, -1 meaning the newest ready version."""
    return [(s.model_name, s.model_version) for s in config.ensemble_scheduling.step]


@dataclass
class _Tensor:
    """An ensemble tensor in the data flow check: produced by a step or an input, and read."""

    ready: bool = False
    produced: bool = False
    readers: int = 0


def validate_structure(config: mc.ModelConfig) -> None:
    """Triton's ``ValidateEnsembleSchedulingConfig``: misplaced fields and the data flow."""
    name = config.name
    if config.HasField("ensemble_scheduling") and not is_ensemble(config):
        _fail(
            f"ensemble scheduling cannot be set for model '{name}' whose platform is not "
            f"{ENSEMBLE_PLATFORM}"
        )
    if not is_ensemble(config):
        return
    if config.instance_group:
        _fail(f"instance group should not be specified for ensemble '{name}'")
    if config.HasField("optimization"):
        _fail(f"optimization should not be specified for ensemble '{name}'")
    if config.model_warmup:
        _fail(f"model_warmup can not be specified for ensemble '{name}'")
    steps = config.ensemble_scheduling.step
    if not steps:
        _fail(f"must specify 'step' for ensemble '{name}'")
    tensors: dict[str, _Tensor] = {}
    for index, step in enumerate(steps):
        where = f"step {index} of ensemble '{name}'"
        if not step.model_name:
            _fail(f"must specify 'model_name' in {where}")
        if not step.input_map:
            _fail(f"must specify 'input_map' in {where}")
        if not step.output_map:
            _fail(f"must specify 'output_map' in {where}")
        for tensor in step.output_map.values():
            entry = tensors.setdefault(tensor, _Tensor())
            if entry.produced:
                _fail(
                    f"ensemble tensor '{tensor}' can appear in an output map only once for "
                    f"ensemble '{name}' step {index}"
                )
            entry.produced = True
        for tensor in step.input_map.values():
            tensors.setdefault(tensor, _Tensor()).readers += 1
    for ensemble_input in config.input:
        if ensemble_input.name not in tensors:
            _fail(f"ensemble input '{ensemble_input.name}' for ensemble {name}' is not used")
        tensors[ensemble_input.name].ready = True
    _propagate(list(steps), tensors)
    outputs = set()
    for output in config.output:
        if output.name not in tensors:
            _fail(f"ensemble output '{output.name}' for ensemble {name}' is not used")
        if not tensors[output.name].ready:
            _fail(f"output '{output.name}' for ensemble '{name}' is not written")
        outputs.add(output.name)
    for tensor_name, entry in sorted(tensors.items()):
        if tensor_name in outputs:
            continue
        if not entry.ready or entry.readers == 0:
            _fail(f"ensemble tensor '{tensor_name}' is unused in ensemble '{name}'")


def _propagate(steps: list[mc.ModelEnsembling.Step], tensors: dict[str, _Tensor]) -> None:
    """Mark ready every tensor a step can write once all its inputs are ready; a step on a
    cycle, or fed by a tensor nothing writes, never becomes ready."""
    done: set[int] = set()
    progress = True
    while progress:
        progress = False
        for index, step in enumerate(steps):
            if index in done or not all(tensors[t].ready for t in step.input_map.values()):
                continue
            done.add(index)
            progress = True
            for tensor in step.output_map.values():
                tensors[tensor].ready = True


#: Finds the completed config of a composing model version (-1: the newest ready one).
ConfigLookup = Callable[[str, int], mc.ModelConfig]


@dataclass(frozen=True)
class _Inferred:
    """What an ensemble tensor is, and which model said so."""

    datatype: int
    dims: tuple[int, ...]
    model: str


def link(config: mc.ModelConfig, lookup: ConfigLookup) -> EnsemblePlan:
    """Triton's ``ValidateEnsembleConfig`` against the composing models' configs; the plan."""
    name = config.name
    batch = config.max_batch_size
    producers: dict[str, _Inferred] = {
        t.name: _Inferred(t.data_type, _full_dims(t.dims, batch), name) for t in config.input
    }
    step_configs = []
    for step in config.ensemble_scheduling.step:
        composing = lookup(step.model_name, step.model_version)
        step_configs.append(composing)
        model = step.model_name
        if batch > 0 and 0 < composing.max_batch_size < batch:
            _fail(
                f"ensemble {name} allows maximum batch size {batch}, but it contains model "
                f"{model} which only allows maximum batch size to be {composing.max_batch_size}"
            )
        inputs = {t.name: t for t in composing.input}
        for model_input, tensor in sorted(step.input_map.items()):
            if model_input not in inputs:
                _fail(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapping to non-existing "
                    f"input {model_input} in model {model}"
                )
        for declared_input in inputs.values():
            if declared_input.name not in step.input_map and not declared_input.optional:
                _fail(
                    f"in ensemble {name}, input {declared_input.name} in model {model} is not "
                    "mapped to any ensemble tensors"
                )
        outputs = {t.name: t for t in composing.output}
        for model_output, tensor in sorted(step.output_map.items()):
            produced = outputs.get(model_output)
            if produced is None:
                _fail(
                    f"in ensemble {name}, ensemble tensor {tensor} is mapped from non-existing "
                    f"output {model_output} in model {model}"
                )
            producers[tensor] = _Inferred(
                produced.data_type, _full_dims(produced.dims, composing.max_batch_size), model
            )
    for step, composing in zip(config.ensemble_scheduling.step, step_configs, strict=True):
        inputs = {t.name: t for t in composing.input}
        for model_input, tensor in sorted(step.input_map.items()):
            declared = inputs[model_input]
            consumer = _Inferred(
                declared.data_type,
                _full_dims(declared.dims, composing.max_batch_size),
                step.model_name,
            )
            _check_consistent(producers[tensor], consumer)
    for output in config.output:
        _check_consistent(
            producers[output.name], _Inferred(output.data_type, _full_dims(output.dims, batch), name)
        )
    return EnsemblePlan(
        name,
        tuple(
            EnsembleStep(
                s.model_name,
                "" if s.model_version < 0 else str(s.model_version),
                dict(s.input_map),
                dict(s.output_map),
            )
            for s in config.ensemble_scheduling.step
        ),
        max(0, config.ensemble_scheduling.max_inflight_requests),
    )


def _full_dims(dims: Iterable[int], max_batch_size: int) -> tuple[int, ...]:
    """The shape a tensor has on the wire: the batch dimension first when the model batches."""
    shape = tuple(int(d) for d in dims)
    return (-1, *shape) if max_batch_size > 0 else shape


def _check_consistent(producer: _Inferred, consumer: _Inferred) -> None:
    if producer.datatype != consumer.datatype:
        _fail(
            f"inconsistent data type: {mc.DataType.Name(producer.datatype)} is inferred from "
            f"model {producer.model} while {mc.DataType.Name(consumer.datatype)} is inferred "
            f"from model {consumer.model}"
        )
    if not _shapes_agree(producer.dims, consumer.dims):
        _fail(
            f"inconsistent shape: {_dims_text(producer.dims)} is inferred from model "
            f"{producer.model} while {_dims_text(consumer.dims)} is inferred from model "
            f"{consumer.model}"
        )


def _shapes_agree(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ",".join(str(d) for d in dims) + "]"


def _fail(message: str) -> NoReturn:
    raise ModelLoadError(message)
