"""The interface every backend implements; the server core knows backends only through it.

A ``Backend`` reads a model file and makes ``ModelInstance`` objects. An instance is one
executable copy of one model version (one ONNX Runtime session, say) and is driven by exactly
one worker thread, so implementations need no locking of their own. Backends know nothing of
HTTP, gRPC or the V2 protocol: they take and return numpy arrays keyed by tensor name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from server.errors import InferenceServerError
from server.generated import model_config_pb2 as mc
from server.memory.output_memory import OutputMemory
from server.protocol.datatypes import DataType


@dataclass(frozen=True)
class TensorInfo:
    """A model tensor as the model file declares it; -1 marks a variable dimension."""

    name: str
    datatype: DataType
    shape: tuple[int, ...]


@dataclass(frozen=True)
class ModelSignature:
    """The inputs and outputs a model file declares, in its own order."""

    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]


@dataclass(frozen=True)
class Placement:
    """Where one instance runs: ``KIND_CPU``, or ``KIND_GPU`` on ``device_id``."""

    kind: int
    device_id: int = 0

    @property
    def is_gpu(self) -> bool:
        return self.kind == mc.ModelInstanceGroup.KIND_GPU


def _never() -> bool:
    return False


#: What ``execute_requests`` gives each request: its outputs, or the error that fails it alone.
RequestResult = dict[str, np.ndarray] | InferenceServerError
#: How a decoupled model answers one request, from any thread, any number of times: a result
#: (or None, for a flags-only completion) and whether it is the request's last (final flag).
ResponseSink = Callable[[RequestResult | None, bool], None]


@dataclass(frozen=True)
class InstanceRequest:
    """One client request as an instance that takes a batch request by request sees it: its
    own inputs (batch dimension first when the model batches), the outputs it wants, its id,
    its request parameters (``priority``, ``sequence_id``, ... included) and whether its
    client has given up on it (read from the instance's thread while it runs). A request to a
    decoupled model carries ``respond``, through which its responses go (see ``ResponseSink``);
    ``execute_requests``'s results for it are then ignored."""

    inputs: Mapping[str, Any]
    output_names: Sequence[str]
    id: str = ""
    parameters: Mapping[str, Any] = field(default_factory=dict)
    cancelled: Callable[[], bool] = _never
    respond: ResponseSink | None = None


class ModelInstance(ABC):
    """One executable copy of a model version, driven by a single worker thread."""

    #: Whether very short executions may run on the event loop instead of the worker thread
    #: (see ``server.scheduling.runner``); code that may block or use asyncio must say no.
    may_run_inline: bool = True
    #: Whether the instance joins a batch itself (``execute_parts``) and takes CuPy device
    #: arrays among its inputs. GPU instances do: each request's rows are copied once into
    #: their slice of one device buffer, so a batch is never first concatenated on the host
    #: (a copy into pageable memory, which would also turn the pinned request buffers' DMA
    #: into a staged copy), and inputs already on the device (CUDA shared memory) stay there.
    joins_on_device: bool = False
    #: Whether schedulers hand the instance the requests of a batch one by one
    #: (``execute_requests``) instead of their inputs joined (``execute``): a Triton-style
    #: python model gets one request object per client request and answers each.
    takes_requests: bool = False

    @abstractmethod
    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        """Run the model on ``inputs`` (already shaped as the model expects: batch dimension
        first when the model batches) and return the named outputs. Raise on model faults."""

    def execute_into(
        self,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        memory: OutputMemory,
    ) -> dict[str, np.ndarray]:
        """``execute``, with outputs that the instance may write into arrays it takes from
        ``memory``. By default it takes none."""
        return self.execute(inputs, output_names)

    def execute_parts(
        self,
        parts: Mapping[str, Sequence[Any]],
        output_names: Sequence[str],
        memory: OutputMemory | None = None,
    ) -> dict[str, np.ndarray]:
        """``execute`` on the inputs that ``parts`` make when joined along their first axis
        (numpy or CuPy arrays, in batch order), with outputs it may copy back into arrays of
        ``memory`` (offered for a request run alone), as ``execute_into``. Schedulers call it,
        instead of ``execute``, only on instances that set ``joins_on_device``."""
        raise NotImplementedError(f"{type(self).__name__} does not join batches itself")

    def execute_requests(self, requests: Sequence[InstanceRequest]) -> list[RequestResult]:
        """Run the requests of one batch, each on its own, and return one result per request
        in their order; raise to fail them all. Schedulers call it, instead of ``execute``,
        only on instances that set ``takes_requests``."""
        raise NotImplementedError(f"{type(self).__name__} does not take requests one by one")

    def is_ready(self) -> bool:
        """Whether the instance can serve now (a model's own readiness check); asked on a
        thread of its own, maybe while the instance executes. True by default."""
        return True

    def close(self) -> None:
        """Release what the instance holds (sessions, device memory); a no-op by default."""


class PartsInstance(ModelInstance):
    """An instance whose one way to run is ``execute_parts``: a request run alone is a batch
    of one part per input (GPU instances, python models)."""

    def execute(
        self, inputs: Mapping[str, np.ndarray], output_names: Sequence[str]
    ) -> dict[str, np.ndarray]:
        return self.execute_parts(_one_part_each(inputs), output_names)

    def execute_into(
        self,
        inputs: Mapping[str, np.ndarray],
        output_names: Sequence[str],
        memory: OutputMemory,
    ) -> dict[str, np.ndarray]:
        return self.execute_parts(_one_part_each(inputs), output_names, memory)

    @abstractmethod
    def execute_parts(
        self,
        parts: Mapping[str, Sequence[Any]],
        output_names: Sequence[str],
        memory: OutputMemory | None = None,
    ) -> dict[str, np.ndarray]: ...


def _one_part_each(inputs: Mapping[str, np.ndarray]) -> dict[str, list[np.ndarray]]:
    return {name: [array] for name, array in inputs.items()}


class Backend(ABC):
    """A kind of model file (ONNX via ONNX Runtime, ...)."""

    #: config ``backend`` value, e.g. "onnxruntime"
    name: str
    #: config ``platform`` value, e.g. "onnxruntime_onnx"
    platform: str
    #: file looked for in a version folder when the config names none, e.g. "model.onnx"
    default_model_filename: str
    #: whether models may set ``model_transaction_policy { decoupled: true }`` (zero or many
    #: responses per request); a load asking for it on another backend is refused
    supports_decoupled: bool = False

    def gpu_count(self) -> int:
        """GPUs this backend can place instances on (KIND_AUTO becomes KIND_GPU on each);
        0, the default, for CPU-only backends."""
        return 0

    def complete_config(self, model_path: Path, config: mc.ModelConfig) -> bool:
        """Let the model file complete ``config`` in place by its own means (a python model's
        ``auto_complete_config``); False, the default, when the backend has none, and the
        configuration is completed from ``signature`` instead. Not called with
        ``--disable-auto-complete-config``."""
        return False

    @abstractmethod
    def signature(self, model_path: Path) -> ModelSignature:
        """Read the model's declared inputs and outputs (used to complete a config)."""

    @abstractmethod
    def load_instance(
        self, model_path: Path, config: mc.ModelConfig, placement: Placement
    ) -> ModelInstance:
        """Load one instance of the model file for ``config`` on ``placement``; raise
        ``server.errors.ModelLoadError`` with a clear reason when it cannot be done."""
