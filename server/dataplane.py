"""The data plane: what every transport calls. Health, metadata, config and inference.

HTTP and gRPC translate their wire formats to these calls and back; nothing here knows a
transport. Results are plain records or dicts in the V2 JSON shape.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from server import __version__
from server.errors import InternalError
from server.generated import model_config_pb2 as mc
from server.protocol import datatypes
from server.protocol.types import InferRequest, InferResponse, OutputTensor
from server.protocol.validation import validate
from server.repository.manager import ModelRepository
from server.settings import Settings

#: Protocol extensions this server implements, named as Triton names them in server metadata.
EXTENSIONS = ("model_configuration", "binary_tensor_data", "parameters")


def _tensor_metadata(tensor: mc.ModelInput | mc.ModelOutput, batching: bool) -> dict[str, Any]:
    shape = [-1, *tensor.dims] if batching else list(tensor.dims)
    datatype = datatypes.from_config_name(mc.DataType.Name(tensor.data_type))
    return {"name": tensor.name, "datatype": datatype.name, "shape": shape}


class DataPlane:
    """Answers the V2 protocol's questions from the model repository."""

    def __init__(self, settings: Settings, repository: ModelRepository) -> None:
        self._settings = settings
        self._repository = repository
        self._live = False

    def set_live(self, live: bool) -> None:
        self._live = live

    def live(self) -> bool:
        return self._live

    def ready(self) -> bool:
        """Live, and with strict readiness every model ready too."""
        if not self._live:
            return False
        return self._repository.all_ready() if self._settings.strict_readiness else True

    def server_metadata(self) -> dict[str, Any]:
        return {
            "name": self._settings.server_id,
            "version": __version__,
            "extensions": list(EXTENSIONS),
        }

    def model_ready(self, name: str, version: str) -> bool:
        return self._repository.is_ready(name, version)

    def model_metadata(self, name: str, version: str) -> dict[str, Any]:
        served = self._repository.version(name, version)
        config = _config_of(served.config)
        batching = config.max_batch_size > 0
        versions = [version] if version else [str(v) for v in self._ready_versions(name)]
        return {
            "name": name,
            "versions": versions,
            "platform": config.platform or config.backend,
            "inputs": [_tensor_metadata(t, batching) for t in config.input],
            "outputs": [_tensor_metadata(t, batching) for t in config.output],
        }

    def _ready_versions(self, name: str) -> list[int]:
        return self._repository.model(name).ready_versions()

    def model_config(self, name: str, version: str) -> mc.ModelConfig:
        return _config_of(self._repository.version(name, version).config)

    async def infer(self, request: InferRequest) -> InferResponse:
        """Validate, run and package one request."""
        served = self._repository.version(request.model_name, request.model_version)
        config = _config_of(served.config)
        prepared = validate(request, config)
        if served.scheduler is None:
            raise InternalError(f"model '{config.name}' version {served.version} has no scheduler")
        results = await served.scheduler.execute(prepared.inputs, prepared.output_names)
        outputs_by_name = {tensor.name: tensor for tensor in config.output}
        batching = config.max_batch_size > 0
        outputs = []
        for name in prepared.output_names:
            spec = outputs_by_name[name]
            datatype = datatypes.from_config_name(mc.DataType.Name(spec.data_type))
            data = _client_shape(results[name], spec, batching, prepared.batch_size)
            outputs.append(OutputTensor(name, datatype, tuple(data.shape), data))
        return InferResponse(
            model_name=config.name,
            model_version=str(served.version),
            outputs=outputs,
            id=request.id,
        )


def _config_of(config: mc.ModelConfig | None) -> mc.ModelConfig:
    if config is None:
        raise InternalError("model has no configuration")
    return config


def _client_shape(
    data: np.ndarray, spec: mc.ModelOutput, batching: bool, batch_size: int
) -> np.ndarray:
    """Undo an output ``reshape``: the client sees the config's dims (with the batch dim)."""
    if not spec.HasField("reshape"):
        return data
    dims = list(spec.dims)
    shape = [batch_size, *dims] if batching else dims
    if -1 in shape[1 if batching else 0 :]:
        return data
    return data.reshape(shape)
