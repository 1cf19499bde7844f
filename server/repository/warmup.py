"""Run a model version's warmup samples on each of its instances before it becomes READY.

As in Triton (``core:src/backend_model_instance.cc`` ``WarmUp``), warmup bypasses the
scheduler: every instance runs every sample itself, ``count`` times, each time executing the
sample's ``batch_size`` requests together, and the version is served only once all of them
succeeded. The executions count in the version's statistics as served requests do (Triton
2.51, ``batch_size: 2 count: 3``: inference_count 6, execution_count 3, success 6).

It runs on the loading thread, while nothing else can reach the instances or the statistics
(the version is not published yet), so the statistics' event-loop-only rule still holds: the
loader's caller sees them only once the load is over.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from backends.base import ModelInstance, RequestResult, ResponseSink
from server.errors import InferenceServerError
from server.generated import model_config_pb2 as mc
from server.observability.statistics import ModelStats
from server.protocol import sequence_spec
from server.protocol.datatypes import DataType
from server.protocol.model_spec import ModelSpec
from server.protocol.types import InferRequest
from server.protocol.validation import PreparedRequest, validate
from server.repository.warmup_data import WarmupSample, warmup_failure
from server.scheduling.job import Job
from server.scheduling.layout import BatchLayout

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NamedInstance:
    """An instance with the name Triton gives it in logs (``<group name>_<index>``)."""

    name: str
    instance: ModelInstance


def instance_names(config: mc.ModelConfig) -> list[str]:
    """The names of the instances the loader makes for ``config``, in the order it makes them."""
    names: list[str] = []
    for group in config.instance_group:
        devices = len(group.gpus) if group.kind == mc.ModelInstanceGroup.KIND_GPU else 1
        names.extend(f"{group.name}_{index}" for index in range(devices * group.count))
    return names


def run_warmup(
    config: mc.ModelConfig,
    samples: Sequence[WarmupSample],
    instances: Sequence[NamedInstance],
    stats: ModelStats,
) -> None:
    """Every sample, ``count`` times, on every instance; raises ``ModelLoadError`` with the
    reason of the first that fails."""
    if not samples:
        return
    spec = ModelSpec.from_config(config)
    layout = BatchLayout.from_config(config)
    decoupled = config.model_transaction_policy.decoupled
    supplied = sequence_spec.supplied_inputs(config)
    prepared = [(sample, _prepared(sample, spec, supplied)) for sample in samples]
    for named in instances:
        for sample, request in prepared:
            _check_batch_size(sample, request, spec, named.instance)
            for iteration in range(sample.count):
                log.debug(
                    "model '%s' instance %s is running warmup sample '%s' for iteration %d",
                    config.name, named.name, sample.name, iteration,
                )
                _run_once(sample, request, named.instance, layout, stats, decoupled)


def _prepared(
    sample: WarmupSample, spec: ModelSpec, supplied: Mapping[str, DataType]
) -> PreparedRequest:
    """The sample's request validated as a client's would be. Inputs the model does not have
    are control inputs to Triton, which the model's inputs do not include: they are left out
    here, so that a sample naming none of the model's inputs fails as it does in Triton. The
    sequence batcher's control and state inputs (``supplied``) that the sample gives go to
    the model as they are: a sequence model is warmed up with the controls its sample sets."""
    inputs = [tensor for tensor in sample.request.inputs if tensor.name in spec.inputs]
    request = InferRequest(spec.name, "", inputs)
    try:
        prepared = validate(request, spec)
    except InferenceServerError as exc:
        raise warmup_failure(exc.message) from None
    for tensor in sample.request.inputs:
        if tensor.name in supplied:
            prepared.inputs[tensor.name] = tensor.data
    return prepared


def _check_batch_size(
    sample: WarmupSample, request: PreparedRequest, spec: ModelSpec, instance: ModelInstance
) -> None:
    """A batch no scheduler would form is refused rather than handed to the backend."""
    rows = sample.batch_size * request.batch_size
    if spec.batching and rows > spec.max_batch_size:
        raise _sample_failed(
            sample, f"batch size {rows} for '{spec.name}', max allowed is {spec.max_batch_size}"
        )
    if not spec.batching and sample.batch_size > 1 and not instance.takes_requests:
        raise _sample_failed(
            sample,
            f"batch size {sample.batch_size} for '{spec.name}', max allowed is 0 (the model "
            "does not batch)",
        )


def _run_once(
    sample: WarmupSample,
    request: PreparedRequest,
    instance: ModelInstance,
    layout: BatchLayout,
    stats: ModelStats,
    decoupled: bool,
) -> None:
    """One execution of the sample's requests together, counted once it has succeeded."""
    jobs = [
        Job(request.inputs, request.output_names, rows=request.batch_size)
        for _ in range(sample.batch_size)
    ]
    started = time.perf_counter_ns()
    try:
        errors = _execute(jobs, instance, layout, decoupled)
    except Exception as exc:  # noqa: BLE001 - a backend's fault fails this load only
        errors = [_text(exc)]
    if errors:
        raise _sample_failed(sample, "; ".join(errors))
    compute_ns = time.perf_counter_ns() - started
    rows = sum(job.rows for job in jobs)
    stats.record_execution(rows, 0, compute_ns, 0)
    for job in jobs:
        stats.record_success(compute_ns, 0, 0, compute_ns, 0, job.rows)


def _execute(
    jobs: list[Job], instance: ModelInstance, layout: BatchLayout, decoupled: bool
) -> list[str]:
    """Run the jobs as the schedulers would hand them to ``instance``; the errors of the
    requests that failed (raises when the whole execution does)."""
    names = jobs[0].output_names
    if instance.takes_requests:
        answers = _DecoupledAnswers(jobs) if decoupled else None
        results = instance.execute_requests([job.instance_request() for job in jobs])
        if answers is not None:
            return answers.errors()
        return [_text(result) for result in results if _failed(result)]
    if instance.joins_on_device:
        instance.execute_parts(layout.gather_parts(jobs), names)
    else:
        instance.execute(layout.gather(jobs, {}), names)
    return []


class _DecoupledAnswers:
    """The responses of a decoupled model's warmup requests, waited for until each request's
    final one (which may come from another thread, after ``execute_requests`` returned)."""

    def __init__(self, jobs: Sequence[Job]) -> None:
        self._lock = threading.Lock()
        self._errors: list[str] = []
        self._done = [threading.Event() for _ in jobs]
        for job, done in zip(jobs, self._done, strict=True):
            job.respond = self._sink(done)

    def _sink(self, done: threading.Event) -> ResponseSink:
        def respond(result: RequestResult | None, final: bool) -> None:
            if result is not None and _failed(result):
                with self._lock:
                    self._errors.append(_text(result))
            if final:
                done.set()

        return respond

    def errors(self) -> list[str]:
        for done in self._done:
            done.wait()
        with self._lock:
            return list(self._errors)


def _failed(result: RequestResult | None) -> bool:
    return isinstance(result, BaseException)


def _text(error: object) -> str:
    if isinstance(error, InferenceServerError):
        return error.message
    if isinstance(error, BaseException):
        return str(error) or type(error).__name__
    return str(error)


def _sample_failed(sample: WarmupSample, why: str) -> InferenceServerError:
    return warmup_failure(f"failed to run warmup sample '{sample.name}': {why}")

