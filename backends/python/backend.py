"""The python backend: ``backend: "python"`` models whose code is ``<version>/model.py``.

Loading an instance imports ``model.py`` (see ``loading``), makes the ``TensorgateModel`` object
and calls its ``initialize(config)``, where ``config`` is the model configuration as the
``/config`` endpoint prints it (a dict) plus one key for the instance::

    "_instance": {"kind": "KIND_CPU" | "KIND_GPU", "device_id": int}

A python file declares no tensors, so the configuration must list the inputs and outputs.

A ``model.py`` written for Triton defines ``TritonPythonModel`` instead; it is served through
the same backend by ``triton_model`` (Triton's ``initialize(args)``, ``execute(requests)``,
``auto_complete_config``, ``is_ready``, ``finalize``).

``execute`` gets views, not copies: of the request's buffer (for an input in system shared
memory, of the server's copy of it), or on KIND_GPU of a client's CUDA shared memory region,
in place on its device. Treat inputs as read-only, and keep none of them after ``execute``
returns: the memory is reused or unmapped.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from backends.base import Backend, ModelInstance, ModelSignature, Placement
from backends.python import triton_model
from backends.python.cuda import CudaPlacement
from backends.python.instance import PythonInstance
from backends.python.loading import (
    ModelSource,
    defines_triton_model,
    forget_module,
    import_module,
    model_class,
    triton_class,
)
from backends.python.pb_utils.config import ModelConfig
from server.errors import InferenceServerError, ModelLoadError
from server.generated import model_config_pb2 as mc
from server.memory.host_pool import HostBufferPool
from server.protocol import datatypes
from server.protocol.proto_json import config_to_json, message_to_json

#: The key ``initialize`` finds the instance's placement under.
INSTANCE_KEY = "_instance"


class PythonBackend(Backend):
    """Runs ``TensorgateModel`` classes in-process, one object per instance."""

    name = "python"
    platform = ""  # python models have no platform
    default_model_filename = "model.py"
    supports_decoupled = True  # a TritonPythonModel answers through its response senders

    def __init__(self, host_pool: HostBufferPool | None = None) -> None:
        """``host_pool`` holds KIND_GPU instances' outputs copied back (the server's pinned
        pool)."""
        self._host_pool = host_pool or HostBufferPool()

    def signature(self, model_path: Path) -> ModelSignature:
        raise ModelLoadError(
            f"unable to complete the configuration of model '{model_path.parent.parent.name}': "
            "a python model must declare its inputs and outputs in config.pbtxt"
        )

    def complete_config(self, model_path: Path, config: mc.ModelConfig) -> bool:
        """A ``TritonPythonModel`` with ``auto_complete_config`` completes ``config`` itself
        (its module is imported for that alone, then forgotten); other models cannot."""
        source = ModelSource(config.name, model_path)
        module = import_module(source)
        try:
            cls = triton_class(module)
            complete = getattr(cls, "auto_complete_config", None)
            if not callable(complete):
                return False
            try:
                completed = complete(ModelConfig(json.dumps(config_to_json(config))))
            except (Exception, SystemExit, KeyboardInterrupt) as exc:
                raise source.load_error("failed in auto_complete_config", exc) from exc
            if not isinstance(completed, ModelConfig):
                raise ModelLoadError(
                    f"unable to load model '{config.name}': auto_complete_config function in "
                    f"{source.label} must return a valid pb.ModelConfig object"
                )
            try:
                updated = json_format.ParseDict(completed.as_dict(), mc.ModelConfig())
            except (json_format.ParseError, TypeError, ValueError) as exc:
                raise ModelLoadError(
                    f"unable to load model '{config.name}': the configuration "
                    f"auto_complete_config returned is not valid: {exc}"
                ) from exc
            updated.name = config.name
            config.CopyFrom(updated)
            return True
        finally:
            forget_module(module)

    def load_instance(
        self, model_path: Path, config: mc.ModelConfig, placement: Placement
    ) -> ModelInstance:
        source = ModelSource(config.name, model_path)
        outputs = {
            tensor.name: datatypes.from_config_enum(tensor.data_type) for tensor in config.output
        }
        if defines_triton_model(model_path):  # it places its own work, on any KIND
            return self._load_triton(source, config, placement, outputs)
        if config.model_transaction_policy.decoupled:
            raise ModelLoadError(
                f"unable to load model '{config.name}': a decoupled python model must define "
                "TritonPythonModel (it answers through response senders)"
            )
        gpu = (
            CudaPlacement(config.name, placement.device_id, self._host_pool)
            if placement.is_gpu
            else None
        )
        scope = gpu.active() if gpu is not None else contextlib.nullcontext()
        with scope:  # module-level code and initialize allocate on the instance's device
            module = import_module(source)
            try:
                model = model_class(module, source)()
                initialize = getattr(model, "initialize", None)
                if callable(initialize):
                    initialize(instance_config(config, placement))
            except InferenceServerError:
                forget_module(module)
                raise
            except (Exception, SystemExit, KeyboardInterrupt) as exc:  # user code: the load
                forget_module(module)  # fails, sys.exit() included; the server goes on
                raise source.load_error("failed to initialize", exc) from exc
        return PythonInstance(source, module, model, outputs, gpu)

    def _load_triton(
        self,
        source: ModelSource,
        config: mc.ModelConfig,
        placement: Placement,
        outputs: dict[str, datatypes.DataType],
    ) -> ModelInstance:
        module = import_module(source)
        try:
            cls = triton_class(module)
            if cls is None:  # rebound to something else when the module ran
                raise ModelLoadError(
                    f"unable to load model '{config.name}': {source.label} defines "
                    f"TritonPythonModel, but not as a class"
                )
            return triton_model.load(source, module, cls, config, placement, outputs)
        except BaseException:
            forget_module(module)
            raise


def instance_config(config: mc.ModelConfig, placement: Placement) -> dict[str, Any]:
    """What ``initialize`` gets: the configuration dict and the instance's placement."""
    data = message_to_json(config)
    data[INSTANCE_KEY] = {
        "kind": mc.ModelInstanceGroup.Kind.Name(placement.kind),
        "device_id": placement.device_id,
    }
    return data
