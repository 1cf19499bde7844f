"""Execution accelerators from the model config, read as Triton's ONNX Runtime backend reads them.

``optimization { execution_accelerators { gpu_execution_accelerator [ ... ] } }`` on a GPU
instance:

- ``cuda``: every parameter is passed through as a CUDA provider option
  (``cudnn_conv_use_max_workspace``, ``use_tf32``, ``cudnn_conv_algo_search``, ...);
  ``device_id`` and ``user_compute_stream`` stay the server's, since the instance's stream is
  what its copies are ordered on. ``enable_cuda_graph`` (and TensorRT's
  ``trt_cuda_graph_enable``) is refused: a graph replays the addresses and shapes it captured,
  and this server binds every batch afresh.
- ``tensorrt``: the TensorRT provider ahead of CUDA, with Triton's parameter names mapped to ONNX
  Runtime's (``precision_mode`` FP16/INT8, ``max_workspace_size_bytes``, ``minimum_segment_size``,
  ``max_partition_iterations``, ``int8_*``) and ``trt_*`` options passed through. It needs
  ONNX Runtime's TensorRT provider and TensorRT itself; without them the load fails.

Any other name is refused with Triton's message. CPU instances take no accelerator this server
has (Triton's is OpenVINO), so a ``cpu_execution_accelerator`` fails their load clearly.
"""

from __future__ import annotations

from collections.abc import Mapping

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc

CPU_PROVIDER = "CPUExecutionProvider"
CUDA_PROVIDER = "CUDAExecutionProvider"
TENSORRT_PROVIDER = "TensorrtExecutionProvider"

#: A provider as ``InferenceSession(providers=...)`` takes it.
Provider = tuple[str, dict[str, str]]

#: Triton's TensorRT parameter names that ONNX Runtime spells otherwise.
_TENSORRT_NAMES = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "minimum_segment_size": "trt_min_subgraph_size",
    "max_partition_iterations": "trt_max_partition_iterations",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}
_PRECISIONS = {"FP32": None, "FP16": "trt_fp16_enable", "INT8": "trt_int8_enable"}


def gpu_providers(
    config: mc.ModelConfig, device_id: int, stream_ptr: int, available: list[str]
) -> list[Provider]:
    """The providers of a GPU instance's session, in order of preference, from the config's
    GPU execution accelerators (CUDA alone when it names none); the CPU provider comes last,
    for the nodes no GPU provider takes."""
    placement = {"device_id": str(device_id), "user_compute_stream": str(stream_ptr)}
    cuda: dict[str, str] = {}
    tensorrt: dict[str, str] | None = None
    for accelerator in config.optimization.execution_accelerators.gpu_execution_accelerator:
        if accelerator.name == "cuda":
            _refuse_graphs(config.name, accelerator.parameters, "enable_cuda_graph")
            cuda.update(accelerator.parameters)
        elif accelerator.name == "tensorrt":
            _refuse_graphs(config.name, accelerator.parameters, "trt_cuda_graph_enable")
            tensorrt = _tensorrt_options(config.name, dict(accelerator.parameters))
        else:
            raise _unknown(config.name, accelerator.name)
    providers: list[Provider] = []
    if tensorrt is not None:
        if TENSORRT_PROVIDER not in available:
            raise ModelLoadError(
                f"unable to load model '{config.name}': the TensorRT execution accelerator needs "
                "ONNX Runtime's TensorRT execution provider, which this onnxruntime does not have"
            )
        providers.append((TENSORRT_PROVIDER, {**tensorrt, **placement}))
    providers.append((CUDA_PROVIDER, {**cuda, **placement}))
    providers.append((CPU_PROVIDER, {}))
    return providers


def check_cpu_accelerators(config: mc.ModelConfig) -> None:
    """Refuse CPU execution accelerators: this server has none of Triton's (OpenVINO)."""
    for accelerator in config.optimization.execution_accelerators.cpu_execution_accelerator:
        if accelerator.name == "openvino":
            raise ModelLoadError(
                f"unable to load model '{config.name}': the OpenVINO execution accelerator is "
                "not available in this server"
            )
        raise _unknown(config.name, accelerator.name)


def _refuse_graphs(model: str, parameters: Mapping[str, str], key: str) -> None:
    """CUDA graphs replay the addresses and shapes they were captured with; this server binds
    each batch afresh (outputs allocated per run, inputs in place from shared memory, batch
    sizes that vary), so a graph would replay into stale memory. Refused rather than wrong."""
    if parameters.get(key, "0").lower() not in ("0", "false"):
        raise ModelLoadError(
            f"unable to load model '{model}': '{key}' is not supported: CUDA graphs need "
            "fixed input and output addresses, and this server binds every batch afresh"
        )


def _tensorrt_options(model: str, parameters: dict[str, str]) -> dict[str, str]:
    options: dict[str, str] = {}
    for key, value in parameters.items():
        if key == "precision_mode":
            if value not in _PRECISIONS:
                raise ModelLoadError(
                    f"unable to load model '{model}': unsupported precision mode '{value}' is "
                    "requested for the TensorRT execution accelerator"
                )
            flag = _PRECISIONS[value]
            if flag is not None:
                options[flag] = "True"  # ORT's TensorRT options take True/False, not 1/0
        elif key in _TENSORRT_NAMES:
            options[_TENSORRT_NAMES[key]] = value
        elif key.startswith("trt_"):
            options[key] = value
        else:
            raise ModelLoadError(
                f"unable to load model '{model}': unknown parameter '{key}' is provided for "
                "TensorRT Execution Accelerator"
            )
    return options


def _unknown(model: str, name: str) -> ModelLoadError:
    return ModelLoadError(
        f"unable to load model '{model}': unknown Execution Accelerator '{name}' is requested"
    )
