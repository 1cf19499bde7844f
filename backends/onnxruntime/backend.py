"""ONNX Runtime backend: one ``InferenceSession`` per model instance.

CPU instances run ``session.run`` on the request's arrays; a run with large outputs whose shapes
the graph gives before the run (``output_shapes``) writes them into memory its caller offers
(``execute_into``: the executor's output arena). GPU instances (KIND_GPU, or KIND_AUTO
on a machine with a GPU and ORT's CUDA execution provider) get a session on the CUDA provider of
their device, their own CUDA stream as its compute stream, and run through IO binding
(``iobinding.CudaDevice``). A GPU instance is never silently served by the CPU: without CuPy,
without the CUDA provider, or when the session comes up on another provider, the load fails
with a clear error. The config's execution accelerators (CUDA options, TensorRT) shape the
providers (``accelerators``).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
import onnxruntime as ort

from backends.base import Backend, ModelInstance, ModelSignature, Placement, TensorInfo
from backends.onnxruntime.accelerators import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    Provider,
    check_cpu_accelerators,
    gpu_providers,
)
from backends.onnxruntime.iobinding import CudaDevice, IoBindingInstance
from backends.onnxruntime.ort_types import BF16, ONNX_BFLOAT16, ORT_TYPES, ort_value_to_numpy
from backends.onnxruntime.output_shapes import OutputShapes
from backends.onnxruntime.strings import bytes_to_strings, strings_to_bytes
from server.cuda.devices import device_count, require_cupy
from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.host_paths import redact_paths
from server.memory.device_pool import DevicePools
from server.memory.host_pool import HostBufferPool
from server.memory.output_memory import OutputMemory
from server.protocol import datatypes, sequence_spec
from server.settings import DEFAULT_CUDA_POOL_BYTES

log = logging.getLogger(__name__)

#: Outputs smaller than this (in all) are copied where the caller wants them: binding them to
#: its memory would cost more than the copy.
DIRECT_OUTPUT_BYTES = 1 << 16

# Models load on several threads at once; ONNX Runtime session creation is done one at a time
# (it holds the GIL for most of it anyway, and concurrent creation has had thread-safety bugs).
_SESSION_CREATION = threading.Lock()
_GRAPH_LEVELS = {
    -1: ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
    1: ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
    2: ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
}

#: ONNX Runtime's pool threads spin after each parallel section by default, holding cores that
#: the front ends and the event loop need. Measured on 2 cores, ``mlp`` over gRPC at c=32 with
#: the default thread count, three pairs: 4,849-6,168/s spinning, 6,573-7,860/s not (8,736/s
#: on one thread); at c=1, 567 µs on average spinning and 585 µs not. So no session spins.
NO_SPINNING = ("session.intra_op.allow_spinning", "session.inter_op.allow_spinning")


def _quiet_options() -> ort.SessionOptions:
    """Session options whose thread pools never spin (``NO_SPINNING``)."""
    options = ort.SessionOptions()
    for spinning in NO_SPINNING:
        options.add_session_config_entry(spinning, "0")
    return options


#: ``run(output_names, feeds)``: one session run on numpy arrays.
SessionRun = Callable[[list[str], dict[str, np.ndarray]], list[np.ndarray]]


def direct_run(session: ort.InferenceSession) -> SessionRun:
    """``session.run`` without the checks its Python wrapper repeats on every call, when the
    wrapper holds its compiled session where it always has (``_sess``); else ``session.run``.

    The wrapper checks that every required input is fed (the compiled ``Run`` refuses a
    missing one too, and the executor's validation refused it before), that no WebGPU graph
    capture is on (never here) and that each ``OrtValue`` fed is on the session's device (only
    numpy arrays come here): 2.2 of the 10.7 µs a run of the example ``simple`` model takes. A
    provider failure still goes to the wrapper, which falls back to its other providers as
    before.
    """
    compiled = getattr(session, "_sess", None)
    run = getattr(compiled, "run", None)
    if run is None:
        return session.run  # type: ignore[no-any-return]
    provider_failure = ort.capi.onnxruntime_pybind11_state.EPFail

    def run_directly(names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        try:
            return run(names, feeds, None)  # type: ignore[no-any-return]
        except provider_failure:
            return session.run(names, feeds)  # type: ignore[no-any-return]

    return run_directly


def _tensor_info(arg: ort.NodeArg, model: str) -> TensorInfo:
    type_name = ORT_TYPES.get(arg.type)
    if type_name is None:
        raise ModelLoadError(
            f"unable to load model '{model}': tensor '{arg.name}' has unsupported type {arg.type}"
        )
    shape = tuple(dim if isinstance(dim, int) and dim >= 0 else -1 for dim in arg.shape or ())
    return TensorInfo(arg.name, datatypes.BY_NAME[type_name], shape)


class OnnxRuntimeBackend(Backend):
    """Loads ``model.onnx`` files; knobs from config ``parameters`` as Triton's ORT backend."""

    name = "onnxruntime"
    platform = "onnxruntime_onnx"
    default_model_filename = "model.onnx"

    def __init__(
        self,
        options: Mapping[str, str] | None = None,
        device_pools: DevicePools | None = None,
        host_pool: HostBufferPool | None = None,
    ) -> None:
        """``options`` are ``--backend-config=onnxruntime,<key>=<value>`` settings;
        ``device_pools`` hold GPU instances' input buffers (``--cuda-memory-pool-byte-size``),
        ``host_pool`` their outputs' host copies (the server's pinned pool)."""
        self._options = dict(options or {})
        self._device_pools = device_pools or DevicePools(lambda device: DEFAULT_CUDA_POOL_BYTES)
        self._host_pool = host_pool or HostBufferPool()

    def gpu_count(self) -> int:
        """GPUs usable for KIND_AUTO: CuPy's devices, if this onnxruntime has the CUDA provider."""
        if CUDA_PROVIDER not in ort.get_available_providers():
            return 0
        return device_count()

    def signature(self, model_path: Path) -> ModelSignature:
        options = _quiet_options()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        model = model_path.parent.parent.name  # <repo>/<model>/<version>/model.onnx
        return _signature(self._session(model_path, options, model), model)

    def load_instance(
        self, model_path: Path, config: mc.ModelConfig, placement: Placement
    ) -> ModelInstance:
        if placement.is_gpu:
            return self._load_gpu_instance(model_path, config, placement.device_id)
        check_cpu_accelerators(config)
        session = self._session(model_path, self._session_options(config), config.name)
        signature = _signature(session, config.name)
        _check_config_matches(config, signature)
        return OnnxRuntimeInstance(session, signature)

    def _load_gpu_instance(
        self, model_path: Path, config: mc.ModelConfig, device_id: int
    ) -> ModelInstance:
        what = f"unable to load model '{config.name}': instance group KIND_GPU"
        if CUDA_PROVIDER not in ort.get_available_providers():
            raise ModelLoadError(
                f"{what} needs a CUDA device and the CUDA execution provider, which this "
                "onnxruntime does not have (install the 'gpu' or 'gpu-cuda13' extra)"
            )
        cupy = require_cupy(what)
        if not 0 <= device_id < device_count():
            raise ModelLoadError(f"{what} asks for GPU {device_id}, which is not available")
        try:
            with cupy.cuda.Device(device_id):
                stream = cupy.cuda.Stream(non_blocking=True)
        except Exception as exc:  # CUDARuntimeError: busy device, no memory
            raise ModelLoadError(f"{what}: GPU {device_id} is not usable: {exc}") from exc
        providers = gpu_providers(config, device_id, stream.ptr, ort.get_available_providers())
        session = self._session(model_path, self._session_options(config), config.name, providers)
        wanted = providers[0][0]
        if session.get_providers()[0] != wanted:  # ORT falls back to the next one silently
            raise ModelLoadError(
                f"{what}: ONNX Runtime created the session on {session.get_providers()} instead "
                f"of {wanted} (check the CUDA, cuDNN and TensorRT libraries)"
            )
        signature = _signature(session, config.name)
        _check_config_matches(config, signature)
        return IoBindingInstance(
            session,
            CudaDevice(cupy, device_id, stream, self._device_pools, self._host_pool),
            OnnxRuntimeInstance(session, signature),
            frozenset(info.name for info in signature.outputs if info.datatype.is_bytes),
        )

    def _session(
        self,
        model_path: Path,
        options: ort.SessionOptions,
        model: str,
        providers: list[Provider] | None = None,
    ) -> ort.InferenceSession:
        try:
            with _SESSION_CREATION:
                return ort.InferenceSession(
                    str(model_path), sess_options=options, providers=providers or [(CPU_PROVIDER, {})]
                )
        except Exception as exc:  # ORT raises its own Fail/InvalidGraph/... types
            # ORT's messages name the file and, for external data, where it points: a client
            # sees the version folder as <model>/<version> and no other host path.
            version = model_path.parent
            text = redact_paths(str(exc), version, f"{model}/{version.name}")
            raise ModelLoadError(f"unable to load model '{model}': {text}") from exc

    def _session_options(self, config: mc.ModelConfig) -> ort.SessionOptions:
        params = {key: value.string_value for key, value in config.parameters.items()}
        merged = {**self._options, **params}
        options = _quiet_options()
        try:
            if "intra_op_thread_count" in merged:
                options.intra_op_num_threads = int(merged["intra_op_thread_count"])
            if "inter_op_thread_count" in merged:
                options.inter_op_num_threads = int(merged["inter_op_thread_count"])
            if merged.get("execution_mode") == "1":
                options.execution_mode = ort.ExecutionMode.ORT_PARALLEL
            if "enable_mem_arena" in merged:
                options.enable_cpu_mem_arena = merged["enable_mem_arena"] not in ("0", "false")
            if "enable_mem_pattern" in merged:
                options.enable_mem_pattern = merged["enable_mem_pattern"] not in ("0", "false")
        except ValueError as exc:
            raise ModelLoadError(f"invalid ONNX Runtime parameter for '{config.name}': {exc}")
        if config.optimization.HasField("graph"):
            level = config.optimization.graph.level
            options.graph_optimization_level = _GRAPH_LEVELS.get(
                level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL
            )
        return options


def _signature(session: ort.InferenceSession, model: str) -> ModelSignature:
    return ModelSignature(
        tuple(_tensor_info(arg, model) for arg in session.get_inputs()),
        tuple(_tensor_info(arg, model) for arg in session.get_outputs()),
    )


def _check_config_matches(config: mc.ModelConfig, signature: ModelSignature) -> None:
    """Refuse a config whose tensors the ONNX file does not have, or has with other types."""
    for kind, declared, actual in (
        ("input", config.input, signature.inputs),
        ("output", config.output, signature.outputs),
    ):
        by_name = {info.name: info for info in actual}
        for tensor in declared:
            info = by_name.get(tensor.name)
            if info is None:
                raise ModelLoadError(
                    f"unable to load model '{config.name}': configuration expects {kind} "
                    f"'{tensor.name}' but the model has {sorted(by_name)}"
                )
            expected = datatypes.from_config_enum(tensor.data_type)
            if expected is not info.datatype:
                raise ModelLoadError(
                    f"unable to load model '{config.name}': {kind} '{tensor.name}' has datatype "
                    f"{info.datatype.config_name} in the model but {expected.config_name} in "
                    "the configuration"
                )
    declared_inputs = {tensor.name for tensor in config.input}
    batch_inputs = {
        target: entry.data_type for entry in config.batch_input for target in entry.target_name
    }
    _check_sequence_tensors(config, signature)
    supplied = sequence_spec.supplied_inputs(config)
    for info in signature.inputs:
        if info.name in supplied:
            continue  # checked above
        if info.name in batch_inputs:
            expected = datatypes.from_config_enum(batch_inputs[info.name])
            if expected is not info.datatype:
                raise ModelLoadError(
                    f"unable to load model '{config.name}': batch input '{info.name}' has "
                    f"datatype {info.datatype.config_name} in the model but "
                    f"{expected.config_name} in the configuration"
                )
        elif info.name not in declared_inputs:
            raise ModelLoadError(
                f"unable to load model '{config.name}': model input '{info.name}' is missing "
                "from the configuration"
            )
    model_inputs = {info.name for info in signature.inputs}
    for target in batch_inputs:
        if target not in model_inputs:
            raise ModelLoadError(
                f"unable to load model '{config.name}': batch input '{target}' is not an input "
                f"of the model (it has {sorted(model_inputs)})"
            )


def _check_sequence_tensors(config: mc.ModelConfig, signature: ModelSignature) -> None:
    """The control and state inputs the sequence batcher fills, and the state outputs it
    keeps, must be tensors of the model with the datatypes the config gives them."""
    for kind, wanted, actual in (
        ("sequence batching input", sequence_spec.supplied_inputs(config), signature.inputs),
        ("sequence batching state output", sequence_spec.supplied_outputs(config),
         signature.outputs),
    ):
        by_name = {info.name: info for info in actual}
        for name, datatype in wanted.items():
            info = by_name.get(name)
            if info is None:
                raise ModelLoadError(
                    f"unable to load model '{config.name}': {kind} '{name}' is not a tensor "
                    f"of the model (it has {sorted(by_name)})"
                )
            if info.datatype is not datatype:
                raise ModelLoadError(
                    f"unable to load model '{config.name}': {kind} '{name}' has datatype "
                    f"{info.datatype.config_name} in the model but {datatype.config_name} in "
                    "the configuration"
                )


class OnnxRuntimeInstance(ModelInstance):
    """One session; BYTES go through the reversible string mapping, BF16 through OrtValues."""

    def __init__(self, session: ort.InferenceSession, signature: ModelSignature) -> None:
        self._session = session
        self._run = direct_run(session)
        self._bf16_outputs = {
            info.name for info in signature.outputs if info.datatype.name == "BF16"
        }
        #: numbers only, no BYTES or BF16 either way: nothing to convert (requests carry the
        #: datatypes of the config, which must match these)
        self._plain = not any(
            info.datatype.is_bytes or info.datatype.name == "BF16"
            for info in (*signature.inputs, *signature.outputs)
        )
        self._output_shapes: OutputShapes | None = OutputShapes(
            session.get_inputs(), session.get_outputs()
        )
        self._quiet = ort.RunOptions()
        self._quiet.log_severity_level = 4  # a refused binding is handled, not logged as error

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        names = list(output_names)
        if self._plain:
            return dict(zip(names, self._run(names, dict(inputs)), strict=True))
        feeds: dict[str, np.ndarray] = {}
        has_bf16 = bool(self._bf16_outputs.intersection(names))
        for name, array in inputs.items():
            if array.dtype == object:
                feeds[name] = bytes_to_strings(array)
            else:
                has_bf16 = has_bf16 or array.dtype == BF16
                feeds[name] = array
        if has_bf16:
            results = self._run_ort_values(feeds, names)
        else:
            results = self._run(names, feeds)
        return {
            name: strings_to_bytes(value) if value.dtype == object else value
            for name, value in zip(names, results)
        }

    def execute_into(
        self,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        memory: OutputMemory,
    ) -> dict[str, np.ndarray]:
        """Large outputs of known shapes are bound to arrays of ``memory``: ONNX Runtime
        writes them there, and nobody copies them again."""
        names = list(output_names)
        planned = None if self._output_shapes is None else self._output_shapes.resolve(
            inputs, names
        )
        if planned is None:
            return self.execute(inputs, names)
        total = sum(math.prod(shape) * dtype.itemsize for dtype, shape in planned)
        if total < DIRECT_OUTPUT_BYTES or any(
            array.dtype == object or array.dtype == BF16 for array in inputs.values()
        ):
            return self.execute(inputs, names)
        outputs: dict[str, np.ndarray] = {}
        for name, (dtype, shape) in zip(names, planned):
            array = memory.allocate(dtype, shape)
            if array is None:  # no room: ORT's own memory (what was taken is the caller's)
                return self.execute(inputs, names)
            outputs[name] = array
        held = [np.ascontiguousarray(array) for array in inputs.values()]
        try:
            binding = self._session.io_binding()
            for name, array in zip(inputs, held):
                binding.bind_cpu_input(name, array)
            for name, array in outputs.items():
                binding.bind_output(
                    name, "cpu", 0, array.dtype.type, list(array.shape), array.ctypes.data
                )
            self._session.run_with_iobinding(binding, self._quiet)
        except Exception as exc:  # noqa: BLE001 - judged by the plain run, below
            # The graph's dimension names may promise shapes its run does not keep; a model
            # fault fails the plain run too, and is raised from there.
            results = self.execute(inputs, names)
            log.warning(
                "a run writing its outputs into the memory offered failed where a plain run "
                "succeeded (the model's dimension names do not give its output shapes); its "
                "outputs are copied from now on: %s", exc,
            )
            self._output_shapes = None
            return results
        return outputs

    def _run_ort_values(self, feeds: dict[str, np.ndarray], names: list[str]) -> list[np.ndarray]:
        """ONNX Runtime's numpy bridge has no bfloat16: go through OrtValues for it."""
        values = {
            name: (
                ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    np.ascontiguousarray(array), ONNX_BFLOAT16
                )
                if array.dtype == BF16
                else ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(array))
            )
            for name, array in feeds.items()
        }
        outputs = self._session.run_with_ort_values(names, values)
        results = []
        for name, value in zip(names, outputs):
            results.append(ort_value_to_numpy(value))
        return results
