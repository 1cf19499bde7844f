"""Execution accelerators from the config, as Triton's ONNX Runtime backend reads them: CUDA
options passed through, TensorRT's names mapped, the instance's device and stream kept, and
Triton's refusals for what cannot be honoured."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from backends.base import Placement
from backends.onnxruntime.accelerators import (
    CPU_PROVIDER,
    CUDA_PROVIDER,
    TENSORRT_PROVIDER,
    check_cpu_accelerators,
    gpu_providers,
)
from backends.onnxruntime.backend import OnnxRuntimeBackend
from scripts import make_models
from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc

ALL = [TENSORRT_PROVIDER, CUDA_PROVIDER, CPU_PROVIDER]
PLACEMENT = {"device_id": "1", "user_compute_stream": "4096"}


def _config(accelerators: str, kind: str = "gpu") -> mc.ModelConfig:
    return text_format.Parse(
        f'name: "m" optimization {{ execution_accelerators {{ {accelerators} }} }}'.replace(
            "ACC", f"{kind}_execution_accelerator"
        ),
        mc.ModelConfig(),
    )


def test_without_accelerators_cuda_then_cpu() -> None:
    assert gpu_providers(mc.ModelConfig(name="m"), 1, 4096, ALL) == [
        (CUDA_PROVIDER, PLACEMENT),
        (CPU_PROVIDER, {}),
    ]


def test_cuda_parameters_are_passed_through_but_not_the_placement() -> None:
    config = _config(
        'ACC { name: "cuda" parameters { key: "use_tf32" value: "0" } '
        'parameters { key: "device_id" value: "7" } '
        'parameters { key: "enable_cuda_graph" value: "0" } '
        'parameters { key: "cudnn_conv_use_max_workspace" value: "1" } }'
    )
    cuda = gpu_providers(config, 1, 4096, ALL)[0]
    assert cuda == (
        CUDA_PROVIDER,
        {
            "use_tf32": "0",
            "enable_cuda_graph": "0",
            "cudnn_conv_use_max_workspace": "1",
            **PLACEMENT,
        },
    )


def test_tensorrt_comes_first_with_tritons_names_mapped() -> None:
    config = _config(
        'ACC { name: "tensorrt" '
        'parameters { key: "precision_mode" value: "FP16" } '
        'parameters { key: "max_workspace_size_bytes" value: "1073741824" } '
        'parameters { key: "minimum_segment_size" value: "3" } '
        'parameters { key: "trt_engine_cache_enable" value: "1" } }'
    )
    providers = gpu_providers(config, 1, 4096, ALL)
    assert [name for name, _ in providers] == [TENSORRT_PROVIDER, CUDA_PROVIDER, CPU_PROVIDER]
    assert providers[0][1] == {
        "trt_fp16_enable": "True",
        "trt_max_workspace_size": "1073741824",
        "trt_min_subgraph_size": "3",
        "trt_engine_cache_enable": "1",
        **PLACEMENT,
    }


@pytest.mark.parametrize(
    ("accelerators", "available", "message"),
    [
        ('ACC { name: "rocm" }', ALL, "unknown Execution Accelerator 'rocm' is requested"),
        (
            'ACC { name: "tensorrt" parameters { key: "bogus" value: "1" } }',
            ALL,
            "unknown parameter 'bogus' is provided for TensorRT Execution Accelerator",
        ),
        (
            'ACC { name: "tensorrt" parameters { key: "precision_mode" value: "FP8" } }',
            ALL,
            "unsupported precision mode 'FP8'",
        ),
        (
            'ACC { name: "cuda" parameters { key: "enable_cuda_graph" value: "1" } }',
            ALL,
            "'enable_cuda_graph' is not supported: CUDA graphs need fixed",
        ),
        (
            'ACC { name: "tensorrt" parameters { key: "trt_cuda_graph_enable" value: "True" } }',
            ALL,
            "'trt_cuda_graph_enable' is not supported",
        ),
        (
            'ACC { name: "tensorrt" }',
            [CUDA_PROVIDER, CPU_PROVIDER],
            "needs ONNX Runtime's TensorRT execution provider",
        ),
    ],
)
def test_refusals(accelerators: str, available: list[str], message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        gpu_providers(_config(accelerators), 0, 0, available)


def test_cpu_accelerators_are_refused_at_load(tmp_path: Path) -> None:
    check_cpu_accelerators(mc.ModelConfig(name="m"))  # none: fine
    with pytest.raises(ModelLoadError, match="OpenVINO execution accelerator is not available"):
        check_cpu_accelerators(_config('ACC { name: "openvino" }', "cpu"))
    path = make_models.save(make_models.add_sub("FP32"), tmp_path / "m" / "1" / "model.onnx")
    config = _config('ACC { name: "dnnl" }', "cpu")
    with pytest.raises(ModelLoadError, match="unknown Execution Accelerator 'dnnl' is requested"):
        OnnxRuntimeBackend().load_instance(path, config, Placement(mc.ModelInstanceGroup.KIND_CPU))
