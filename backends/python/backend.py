"""The python backend: ``backend: "python"`` models whose code is ``<version>/model.py``.

Loading an instance imports ``model.py`` (see ``loading``), makes the ``TensorgateModel`` object
and calls its ``initialize(config)``, where ``config`` is the model configuration as the
``/config`` endpoint prints it (a dict) plus one key for the instance::

    "_instance": {"kind": "KIND_CPU" | "KIND_GPU", "device_id": int}

A python file declares no tensors, so the configuration must list the inputs and outputs.

``execute`` gets views, not copies: of the request's buffer (for an input in system shared
memory, of the server's copy of it), or on KIND_GPU of a client's CUDA shared memory region,
in place on its device. Treat inputs as read-only, and keep none of them after ``execute``
returns: the memory is reused or unmapped.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

from backends.base import Backend, ModelInstance, ModelSignature, Placement
from backends.python.cuda import CudaPlacement
from backends.python.instance import PythonInstance
from backends.python.loading import ModelSource, forget_module, import_module, model_class
from server.errors import InferenceServerError, ModelLoadError
from server.generated import model_config_pb2 as mc
from server.memory.host_pool import HostBufferPool
from server.protocol import datatypes
from server.protocol.proto_json import message_to_json

#: The key ``initialize`` finds the instance's placement under.
INSTANCE_KEY = "_instance"


class PythonBackend(Backend):
    """Runs ``TensorgateModel`` classes in-process, one object per instance."""

    name = "python"
    platform = ""  # python models have no platform
    default_model_filename = "model.py"

    def __init__(self, host_pool: HostBufferPool | None = None) -> None:
        """``host_pool`` holds KIND_GPU instances' outputs copied back (the server's pinned
        pool)."""
        self._host_pool = host_pool or HostBufferPool()

    def signature(self, model_path: Path) -> ModelSignature:
        raise ModelLoadError(
            f"unable to complete the configuration of model '{model_path.parent.parent.name}': "
            "a python model must declare its inputs and outputs in config.pbtxt"
        )

    def load_instance(
        self, model_path: Path, config: mc.ModelConfig, placement: Placement
    ) -> ModelInstance:
        source = ModelSource(config.name, model_path)
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
        outputs = {
            tensor.name: datatypes.from_config_enum(tensor.data_type) for tensor in config.output
        }
        return PythonInstance(source, module, model, outputs, gpu)


def instance_config(config: mc.ModelConfig, placement: Placement) -> dict[str, Any]:
    """What ``initialize`` gets: the configuration dict and the instance's placement."""
    data = message_to_json(config)
    data[INSTANCE_KEY] = {
        "kind": mc.ModelInstanceGroup.Kind.Name(placement.kind),
        "device_id": placement.device_id,
    }
    return data
