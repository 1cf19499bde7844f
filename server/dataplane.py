"""The data plane: what every transport calls. Health, metadata, config and inference.

HTTP and gRPC translate their wire formats to these calls and back; nothing here knows a
transport. Results are plain records or dicts in the V2 JSON shape.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, TypeVar

import numpy as np

from server import __version__, decoupled, logs, response_cache
from server.cuda.devices import DEVICE_KINDS
from server.errors import (
    InferenceServerError,
    InternalError,
    InvalidArgument,
    ModelLoadError,
    NotFound,
    Unavailable,
    Unsupported,
    failure_reason,
)
from server.generated import grpc_service_pb2 as pb
from server.generated import model_config_pb2 as mc
from server.memory.host_pool import HostBufferPool
from server.memory.output_memory import OutputMemory
from server.memory.shared_memory import RegionLease, SharedMemoryRegistry
from server.observability.metrics import CacheSample, ModelEntry
from server.observability.statistics import statistics_response
from server.protocol import classification, datatypes
from server.protocol.binary import tensor_from_bytes, tensor_to_bytes
from server.protocol.model_spec import ModelSpec, TensorSpec
from server.protocol.refusals import request_refused
from server.protocol.shapes import element_count
from server.protocol.streaming import StreamReply
from server.protocol.types import (
    InferRequest,
    InferResponse,
    InputTensor,
    OutputTensor,
    RequestedOutput,
    response_parameters,
)
from server.protocol.validation import validate
from server.repository import ensemble_config
from server.repository.config import parse_json_config
from server.repository.loader import ModelVersion, State
from server.repository.manager import ModelRepository
from server.repository.versions import request_version
from server.request_gate import RequestGate
from server.scheduling.ensemble import StepResult
from server.scheduling.job import Job
from server.settings import Settings
from server.threads import off_loop_if_large, run_in_thread
from server.tracing import stamps
from server.tracing.manager import TraceManager
from server.tracing.record import Trace

log = logging.getLogger("server")
T = TypeVar("T")
#: The trace of the ensemble request whose steps the current task runs (set only while a
#: traced ensemble request executes: its step tasks inherit it).
_ENSEMBLE_TRACE: contextvars.ContextVar[Trace | None] = contextvars.ContextVar(
    "ensemble_trace", default=None
)
_BYTES = datatypes.from_name("BYTES")

#: Protocol extensions this server implements, named as Triton names them in server metadata.
EXTENSIONS = (
    "classification",
    "sequence",
    "sequence(string_id)",
    "model_repository",
    "model_repository(unload_dependents)",
    "model_configuration",
    "binary_tensor_data",
    "schedule_policy",
    "parameters",
    "statistics",
    "system_shared_memory",
    "trace",
    "logging",
)


def _tensor_metadata(tensor: TensorSpec, batching: bool) -> dict[str, Any]:
    return {
        "name": tensor.name,
        "datatype": tensor.datatype.name,
        "shape": tensor.client_shape(batching),
    }


class DataPlane:
    """Answers the V2 protocol's questions from the model repository."""

    def __init__(
        self,
        settings: Settings,
        repository: ModelRepository,
        pool: HostBufferPool | None = None,
    ) -> None:
        """``pool`` (the server's host pool) holds the copies of shared memory inputs."""
        self._settings = settings
        self._repository = repository
        self._live = False
        self.gate = RequestGate()
        self.remote = False  # (``Plane.remote``)
        self.shared_memory = SharedMemoryRegistry(settings.allow_client_shm, pool)
        size = settings.response_cache_byte_size
        self.response_cache = response_cache.ResponseCache(size) if size else None
        self.tracer = TraceManager(settings.trace)
        # Ensembles send their steps back through this data plane (tests may pass no repository).
        ensembles = getattr(repository, "ensembles", None)
        if ensembles is not None:
            ensembles.step_runner = self.run_step

    def set_live(self, live: bool) -> None:
        self._live = live

    def live(self) -> bool:
        return self._live

    def requests_held(self) -> contextlib.AbstractContextManager[None]:
        """Nothing is held in one process: a request starts as soon as it is read."""
        return contextlib.nullcontext()

    async def ready(self) -> bool:
        """Live and not stopping, and with strict readiness every model ready too."""
        if not self._live or self.gate.closed:
            return False
        return self._repository.all_ready() if self._settings.strict_readiness else True

    async def server_metadata(self) -> dict[str, Any]:
        return {
            "name": self._settings.server_id,
            "version": __version__,
            "extensions": [
                *EXTENSIONS,
                *(["cuda_shared_memory"] if self.shared_memory.cuda_available else []),
            ],
        }

    async def model_ready(self, name: str, version: str) -> bool:
        """READY, and every instance's own check (a python model's ``is_ready``) agrees."""
        if not self._repository.is_ready(name, version):
            return False
        try:
            scheduler = self._repository.version(name, version).scheduler
        except InferenceServerError:  # unloaded meanwhile
            return False
        return scheduler is None or await scheduler.ready()

    async def model_metadata(self, name: str, version: str) -> dict[str, Any]:
        served = self._repository.version(name, version)
        config = _required(served.config)
        spec = _required(served.spec)
        if version:
            versions = [str(served.version)]
        else:
            versions = [str(v) for v in self._repository.model(name).ready_versions()]
        return {
            "name": name,
            "versions": versions,
            "platform": config.platform or config.backend,
            "inputs": [_tensor_metadata(t, spec.batching) for t in spec.inputs.values()],
            "outputs": [_tensor_metadata(t, spec.batching) for t in spec.outputs.values()],
        }

    async def model_spec(self, name: str, version: str) -> ModelSpec:
        """What requests to this model are checked against (raises for unknown models)."""
        return _required(self._repository.version(name, version).spec)

    async def model_config(self, name: str, version: str) -> mc.ModelConfig:
        return _required(self._repository.version(name, version).config)

    async def infer(
        self, request: InferRequest, memory: OutputMemory | None = None
    ) -> InferResponse:
        """Validate, run and package one request, and count it in the version's statistics.
        Shared memory regions the request names are held for it until it is answered. A
        model run for this request alone may write its outputs into ``memory``."""
        regions = _regions(request)
        if not regions:
            return await self._infer(request, None, memory=memory)
        with self.shared_memory.lease(regions) as lease:
            return await self._infer(request, lease, memory=memory)

    async def infer_stream(
        self, request: InferRequest, memory: OutputMemory | None = None
    ) -> AsyncIterator[StreamReply]:
        """Every reply to ``request``: a decoupled model's responses as it sends them (see
        ``server.decoupled``), another model's one response, flagged final (its outputs
        maybe in ``memory``, as ``infer``'s)."""
        served = self._repository.version(request.model_name, request.model_version)
        spec = _required(served.spec)
        if not spec.decoupled:
            yield StreamReply(response=await self.infer(request, memory), final=True)
            return
        async for reply in decoupled.replies(served, spec, request, _client_shape):
            yield reply

    async def run_step(
        self,
        model_name: str,
        model_version: str,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        request_id: str,
        parameters: Mapping[str, Any],
    ) -> StepResult:
        """One ensemble step: an internal request to a composing model, on the same path as
        a client's (validated, scheduled, counted in its statistics)."""
        spec = _required(self._repository.version(model_name, model_version).spec)
        request = InferRequest(
            model_name,
            model_version,
            [
                InputTensor(
                    name,
                    # an input the model lacks is refused by validation, by name
                    spec.inputs[name].datatype if name in spec.inputs else _BYTES,
                    tuple(data.shape),
                    data,
                )
                for name, data in inputs.items()
            ],
            [RequestedOutput(name) for name in output_names],
            id=request_id or None,
            parameters=dict(parameters),
        )
        times: list[tuple[int, int, int]] = []
        response = await self._infer(request, None, times)
        return StepResult({o.name: o.data for o in response.outputs}, *times[0])

    async def _infer(
        self,
        request: InferRequest,
        lease: RegionLease | None,
        compute_sink: list[tuple[int, int, int]] | None = None,
        memory: OutputMemory | None = None,
    ) -> InferResponse:
        """``compute_sink`` receives the request's compute (input, infer, output) durations
        as its statistics counted them (an ensemble step's caller adds them up)."""
        start = time.perf_counter_ns()
        served = self._repository.version(request.model_name, request.model_version)
        spec = _required(served.spec)
        trace = None
        if self.tracer.active:  # the one check when tracing is off
            trace = self._trace(request, served)
        if spec.decoupled:  # (the transports refuse it first, each with Triton's text)
            raise Unsupported(
                f"model '{spec.name}' uses the decoupled transaction policy: its responses "
                "are served on a stream only"
            )
        try:
            if lease is not None:  # region copies and parsing: off the loop when large
                await off_loop_if_large(
                    sum(t.shared_memory.byte_size for t in request.inputs if t.shared_memory),
                    _read_shared_inputs,
                    request,
                    lease,
                    served.scheduler is not None and served.scheduler.takes_device_arrays,
                )
            prepared = validate(request, spec)
            prepared_at = time.perf_counter_ns()
            counts = classification.class_counts(request)
            digest = (
                None if self.response_cache is None
                else await self._cache_key(served, request, prepared.output_names, counts)
            )
            if digest is not None:
                cached = self._lookup(digest)
                looked_up = time.perf_counter_ns()
                if cached is not None:
                    answer = self._answer_from_cache(
                        request, served, spec, cached, start, prepared_at, looked_up,
                        compute_sink,
                    )
                    if trace is not None:
                        stamps.cache_hit(trace, answer, start, prepared_at)
                    return answer
            job = Job(
                prepared.inputs,
                prepared.output_names,
                rows=prepared.batch_size,
                priority=request.parameters.get("priority", 0),
                timeout_us=request.parameters.get("timeout"),
                request_id=request.id or "",
                parameters=request.parameters,
                memory=memory,
            )
            # Admitted in the same step as the lookup: a reload or unload that closes this
            # version's gate afterwards waits for this request.
            queued_at = time.perf_counter_ns() if trace is not None else 0
            ensemble = trace is not None and ensemble_config.is_ensemble(_required(served.config))
            token = _ENSEMBLE_TRACE.set(trace) if ensemble else None
            try:
                with served.gate.admit():
                    results = await self._execute(served, spec, request, job)
            finally:
                if token is not None:
                    _ENSEMBLE_TRACE.reset(token)
            executed_at = time.perf_counter_ns()
            outputs = []
            for name in prepared.output_names:
                declared = spec.outputs[name]
                data = results[name]
                if declared.reshape is not None:
                    data = _client_shape(data, declared, spec.batching, prepared.batch_size)
                datatype = datatypes.of_output(data, declared.datatype)
                output = OutputTensor(name, datatype, data.shape, data)
                count = counts.get(name, 0) if counts else 0
                if count:
                    output = classification.classify(output, count, spec.batching, declared.labels)
                outputs.append(output)
            if lease is not None:
                await off_loop_if_large(
                    sum(o.data.nbytes for o in outputs),
                    _write_shared_outputs,
                    request,
                    outputs,
                    lease,
                )
        except asyncio.CancelledError:
            served.stats.record_failure(time.perf_counter_ns() - start, "CANCELED")
            self._log_request(request, served, "CANCELED", start)
            stamps.failure(trace, start)
            raise
        except Exception as exc:
            served.stats.record_failure(time.perf_counter_ns() - start, failure_reason(exc))
            self._log_failure(request, served, exc, start)
            stamps.failure(trace, start)
            raise
        finished = time.perf_counter_ns()
        if digest is not None:  # a miss: its insert counts in the request's duration
            self._insert(digest, outputs)
            served.stats.record_cache_miss(
                looked_up - prepared_at + time.perf_counter_ns() - finished
            )
        done = time.perf_counter_ns()
        compute = job.times.breakdown or (
            prepared_at - start, job.times.compute_ns, finished - executed_at
        )
        if compute_sink is not None:
            compute_sink.append(compute)
        # Executions (batches) are counted by the scheduler; this counts the request.
        served.stats.record_success(
            done - start, job.times.queue_ns, *compute, prepared.batch_size
        )
        self._log_request(request, served, "OK", start)
        response = InferResponse(
            model_name=spec.name,
            model_version=str(served.version),
            outputs=outputs,
            id=request.id,
            parameters=response_parameters(results),
        )
        if trace is not None:
            stamps.success(
                trace, request, response, job.times, compute,
                (start, queued_at, finished, done), not ensemble,
            )
        return response

    def _trace(self, request: InferRequest, served: ModelVersion) -> Trace | None:
        """The request's trace: a client's request if it is sampled, a step of a traced
        ensemble request always (a child of that trace)."""
        if request.trace is not None:
            return self.tracer.start(served.name, served.version, request.id or "", request.trace)
        parent = _ENSEMBLE_TRACE.get()
        if parent is None:
            return None
        return self.tracer.child(parent, served.name, served.version, request.id or "")

    async def _cache_key(
        self,
        served: ModelVersion,
        request: InferRequest,
        output_names: Sequence[str],
        counts: Mapping[str, int],
    ) -> bytes | None:
        """The response cache key of a request it may answer, else None: the cache is off or
        the model does not enable it, an output goes to shared memory (the answer is written
        into client memory, not returned), or an input is on a GPU."""
        config = served.config
        if self.response_cache is None or config is None or not config.response_cache.enable:
            return None
        if any(o.shared_memory for o in request.outputs or ()):
            return None
        if not all(type(t.data) is np.ndarray for t in request.inputs):
            return None
        return await off_loop_if_large(
            sum(t.data.nbytes for t in request.inputs),
            response_cache.key,
            served.name,
            served.version,
            served.load,
            request.inputs,
            {name: counts.get(name, 0) for name in output_names},
            request.parameters,
        )

    def _lookup(self, digest: bytes) -> tuple[OutputTensor, ...] | None:
        return None if self.response_cache is None else self.response_cache.lookup(digest)

    def _insert(self, digest: bytes, outputs: Sequence[OutputTensor]) -> None:
        """Keep a copy of a successful answer (one with an output off the host is not kept)."""
        if self.response_cache is not None and all(type(o.data) is np.ndarray for o in outputs):
            self.response_cache.insert(digest, outputs)

    def _answer_from_cache(
        self,
        request: InferRequest,
        served: ModelVersion,
        spec: ModelSpec,
        outputs: Sequence[OutputTensor],
        start: int,
        prepared_at: int,
        looked_up: int,
        compute_sink: list[tuple[int, int, int]] | None,
    ) -> InferResponse:
        """A hit: a success without an execution (Triton's counting, see ``ModelStats``)."""
        if compute_sink is not None:
            compute_sink.append((0, 0, 0))
        served.stats.record_cache_hit(
            time.perf_counter_ns() - start, 0, looked_up - prepared_at
        )
        self._log_request(request, served, "OK", start)
        return InferResponse(
            model_name=spec.name,
            model_version=str(served.version),
            outputs=list(outputs),
            id=request.id,
        )

    def _log_request(
        self, request: InferRequest, served: ModelVersion, status: str, start: int
    ) -> None:
        """``--log-verbose`` ≥ 1: one line per request."""
        if logs.verbose_level() >= 1:
            log.info(
                "infer model=%s version=%d id=%r status=%s duration_us=%d",
                served.name, served.version, request.id or "", status,
                (time.perf_counter_ns() - start) // 1000,
            )

    def _log_failure(
        self, request: InferRequest, served: ModelVersion, error: Exception, start: int
    ) -> None:
        """Every failed request is logged with its id, server faults as warnings (the
        transport that answers them logs their traceback); at verbose ≥ 1 the per-request
        line follows."""
        log.log(
            logging.WARNING if isinstance(error, InternalError) else logging.INFO,
            "request id %r to model '%s' version %d failed: %s",
            request.id or "", served.name, served.version, error,
        )
        self._log_request(request, served, type(error).__name__, start)

    async def _execute(
        self,
        served: ModelVersion,
        spec: ModelSpec,
        request: InferRequest,
        job: Job,
    ) -> dict[str, np.ndarray]:
        scheduler = _required(served.scheduler)
        try:
            return await scheduler.execute(job)
        except asyncio.CancelledError:
            log.debug("request id %r to model '%s' cancelled by its client", request.id, spec.name)
            raise
        except InferenceServerError:
            raise
        except Exception as exc:  # a model fault fails only this request
            raise InternalError(
                f"model '{spec.name}' version {served.version} failed: {exc}"
            ) from exc

    # --- model repository extension ---------------------------------------------------------

    async def repository_index(self, ready_only: bool) -> list[dict[str, Any]]:
        return self._repository.index(ready_only)

    async def load_model(
        self, name: str, config_json: str | None, files: dict[str, bytes]
    ) -> None:
        """Load or reload a model (explicit mode only), optionally with a JSON config and
        file overrides written to a private folder (which need the config, as in Triton)."""
        self._require_explicit_mode()
        if files and config_json is None:
            raise InvalidArgument(
                "Load parameter 'config' must be specified for model file override"
            )
        override = None
        if config_json is not None:
            try:  # a config may be as large as a request body: parsed off the loop
                override = await asyncio.to_thread(parse_json_config, config_json)
            except ModelLoadError as exc:
                raise ModelLoadError(f"failed to load '{name}': {exc.message}") from None
        await self._repository.load(name, override, files)

    async def unload_model(self, name: str, unload_dependents: bool = False) -> None:
        """Unload a model (explicit mode only); ``unload_dependents`` takes an ensemble's
        composing models with it."""
        self._require_explicit_mode()
        await self._repository.unload(name, unload_dependents)

    # --- statistics extension -----------------------------------------------------------------

    async def statistics(self, name: str, version: str) -> pb.ModelStatisticsResponse:
        """Cumulative statistics: every loaded version of every model ("" name), of one model,
        or of one version."""
        wanted = request_version(version)
        if not name:
            models = sorted(self._repository.models.items())
        else:
            models = [(name, self._repository.model(name))]
        entries = []
        for model_name, model in models:
            for number, served in sorted(model.versions.items()):
                if wanted is not None and number != wanted:
                    continue
                if served.state is State.READY or wanted is not None:
                    entries.append((model_name, str(number), served.stats))
        if wanted is not None and not entries:
            raise NotFound(f"Request for unknown model: '{name}' version {wanted} is not found")
        return statistics_response(entries)

    def metric_entries(self) -> list[ModelEntry]:
        """Every READY model version with its counters and queue length, for ``/metrics``."""
        entries = []
        for name, model in sorted(self._repository.models.items()):
            for number, served in sorted(model.versions.items()):
                if served.state is State.READY and served.scheduler is not None:
                    entries.append(
                        ModelEntry(name, str(number), served.stats, served.scheduler.pending)
                    )
        return entries

    def cache_sample(self) -> CacheSample | None:
        """The response cache's fill for ``/metrics`` (None: no cache configured)."""
        cache = self.response_cache
        return None if cache is None else CacheSample(len(cache), cache.utilization())

    # --- shared memory extensions ------------------------------------------------------------

    async def shm_status(self, kind: str, name: str) -> list[dict[str, Any]]:
        return self.shared_memory.status(kind, name)

    async def shm_register_system(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self.shared_memory.register_system(name, key, offset, byte_size)

    async def shm_register_cuda(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        # Opening an IPC handle is a blocking driver call (it may create a CUDA context).
        await run_in_thread(
            self.shared_memory.register_cuda, name, raw_handle, device_id, byte_size
        )

    async def shm_unregister(self, kind: str, name: str) -> None:
        self.shared_memory.unregister(kind, name)

    async def log_settings(self, changes: dict[str, Any]) -> dict[str, Any]:
        """The logging extension: this process's loggers (in the split layout the executor's;
        ``server.ipc.service`` passes the change on to the front ends)."""
        return logs.update(changes)

    async def trace_settings(self, model_name: str, changes: dict[str, Any] | None) -> dict[
        str, Any
    ]:
        """The trace extension: apply checked changes (``server.tracing.api``; None: just
        read) to the global settings ("") or a model's; every setting after them."""
        if model_name and not self._repository.is_ready(model_name, ""):
            raise InvalidArgument(f"Request for unknown model : {model_name}")
        if changes is not None:
            self.tracer.update(model_name, changes)
        return self.tracer.settings(model_name)

    def close(self) -> None:
        """The server stops: shared memory regions are unmapped, traces written out."""
        self.shared_memory.close()
        self.tracer.close()

    def _require_explicit_mode(self) -> None:
        if self._settings.model_control_mode != "explicit":
            raise Unavailable("explicit model load / unload is not allowed if polling is enabled")


def _required(value: T | None) -> T:
    """A part every READY version has; its absence is a server fault."""
    if value is None:
        raise InternalError("model version is not fully loaded")
    return value


def _regions(request: InferRequest) -> set[str]:
    """The shared memory regions ``request`` names (plain loops: this runs per request)."""
    regions = set()
    for tensor in request.inputs:
        if tensor.shared_memory is not None:
            regions.add(tensor.shared_memory.region)
    for output in request.outputs or ():
        if output.shared_memory is not None:
            regions.add(output.shared_memory.region)
    return regions


def _client_shape(
    data: np.ndarray, declared: TensorSpec, batching: bool, batch_size: int
) -> np.ndarray:
    """Undo an output ``reshape``: the client sees the config's dims (with the batch dim)."""
    if declared.reshape is None or -1 in declared.dims:
        return data
    shape = [batch_size, *declared.dims] if batching else list(declared.dims)
    return data.reshape(shape)


def _read_shared_inputs(request: InferRequest, lease: RegionLease, on_device: bool) -> None:
    """Give every input named in a shared memory region its data: a copy of its bytes in host
    memory (``RegionLease.read``). With ``on_device`` (the model's instances join on their
    GPUs), a numeric input in a CUDA region is a CuPy view of it, handed to the instance
    without passing through the host."""
    for tensor in request.inputs:
        ref = tensor.shared_memory
        if ref is None:
            continue
        if not tensor.datatype.is_bytes:
            expected = element_count(tensor.shape) * tensor.datatype.itemsize
            if ref.byte_size != expected:
                raise request_refused(
                    request.id,
                    f"input byte size mismatch for input '{tensor.name}' for model "
                    f"'{request.model_name}'. Expected {expected}, got {ref.byte_size}",
                )
        if on_device and tensor.datatype.dtype.kind in DEVICE_KINDS:
            raw = lease.read_on_device(ref.region, ref.offset, ref.byte_size, tensor.name)
            if raw is not None and raw.data.ptr % tensor.datatype.itemsize == 0:
                tensor.data = raw.view(tensor.datatype.dtype).reshape(tensor.shape)
                continue
        view = lease.read(ref.region, ref.offset, ref.byte_size, tensor.name)
        tensor.data = tensor_from_bytes(
            view, tensor.datatype, tensor.shape, tensor.name, request.model_name, request.id
        )


def _write_shared_outputs(
    request: InferRequest, outputs: list[OutputTensor], lease: RegionLease
) -> None:
    """Write the outputs asked for in shared memory into their regions. Inputs read from a
    region are the request's own copies, so an output viewing one is unchanged by a write
    into that region."""
    wanted = {o.name: o.shared_memory for o in request.outputs or () if o.shared_memory}
    for output in outputs:
        ref = wanted.get(output.name)
        if ref is not None:
            blob = tensor_to_bytes(output.data, output.datatype)
            lease.write(ref.region, ref.offset, ref.byte_size, output.name, blob)
            output.shared_memory = ref
