"""Model repositories built for tests from ``scripts/make_models.py``."""

from __future__ import annotations

import json
from itertools import pairwise
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from scripts import make_models

#: Every V2 datatype; a ``dt_<type>`` identity model exists for each.
DATATYPES = make_models.V2_DATATYPES


def identity_name(datatype: str) -> str:
    return f"dt_{datatype.lower()}"


def build_datatype_repository(root: Path) -> Path:
    """``dt_<type>`` identities ([batch, -1], auto-completed) for every datatype, ``add_sub_fp32``,
    a non-batching identity with a config, raw-request models, and ``rows_of_three``, which
    fails inside ONNX Runtime on some inputs."""
    for datatype in DATATYPES:
        make_models.save(
            make_models.identity(datatype, ["batch", -1]),
            root / identity_name(datatype) / "1" / "model.onnx",
        )
    make_models.save(make_models.add_sub("FP32"), root / "add_sub_fp32" / "1" / "model.onnx")
    make_models.save(make_models.identity("FP32", [8]), root / "nobatch_fp32" / "1" / "model.onnx")
    (root / "nobatch_fp32" / "config.pbtxt").write_text(
        'name: "nobatch_fp32"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
    )
    make_models.save(
        make_models.identity("FP16", ["batch", -1, -1]), root / "two_var_fp16" / "1" / "model.onnx"
    )
    make_models.save(
        make_models.identity("BYTES", ["batch", 1]), root / "bytes_one" / "1" / "model.onnx"
    )
    make_models.save(rows_of_three_model(), root / "rows_of_three" / "1" / "model.onnx")
    return root


def rows_of_three_model() -> onnx.ModelProto:
    """FP32 [batch, -1] -> [-1, 3]: fails inside ONNX Runtime when the element count is not a
    multiple of 3 (a model fault the server must answer with 500 and survive)."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["INPUT0", "shape"], ["OUTPUT0"])],
        "rows_of_three",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", "n"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["rows", 3])],
        [numpy_helper.from_array(np.array([-1, 3], dtype=np.int64), "shape")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", make_models.OPSET)])
    model.ir_version = make_models.IR_VERSION
    return model


def ragged_model() -> onnx.ModelProto:
    """What a model built for Triton's ragged batching looks like: the ragged INPUT arrives as
    one flat FP32 tensor of every request's elements, ENDS (a ``batch_input`` of kind
    BATCH_ACCUMULATED_ELEMENT_COUNT) marks where each request ends. OUTPUT = 2 * INPUT, element
    by element (scattered back with BATCH_SCATTER_WITH_INPUT_SHAPE); LAST_END = ENDS, one value
    per request (one row each)."""
    two = numpy_helper.from_array(np.array(2.0, dtype=np.float32), "two")
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["INPUT", "two"], ["OUTPUT"]),
            helper.make_node("Identity", ["ENDS"], ["LAST_END"]),
        ],
        "ragged",
        [
            helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["elements"]),
            helper.make_tensor_value_info("ENDS", TensorProto.INT32, ["requests"]),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["elements"]),
            helper.make_tensor_value_info("LAST_END", TensorProto.INT32, ["requests"]),
        ],
        [two],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", make_models.OPSET)])
    model.ir_version = make_models.IR_VERSION
    return model


RAGGED_CONFIG = """name: "ragged"
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ]
batch_input [ { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: "ENDS" data_type: TYPE_INT32
                source_input: "INPUT" } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "LAST_END" data_type: TYPE_INT32 dims: [ 1 ] } ]
batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUTPUT"
                 source_input: "INPUT" } ]
dynamic_batching { max_queue_delay_microseconds: 20000 }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""


def build_ragged_repository(root: Path) -> Path:
    """``ragged``: the model above with its Triton config (batching with a 20 ms delay)."""
    make_models.save(ragged_model(), root / "ragged" / "1" / "model.onnx")
    make_models.write_text(RAGGED_CONFIG, root / "ragged" / "config.pbtxt")
    return root


def build_slow_repository(root: Path, matmuls: int = 24, width: int = 2048) -> Path:
    """``slow``: FP32 [batch, width] through ``matmuls`` identity MatMuls, one instance, so a
    request with many rows keeps the model busy for a while (tests of queueing and draining)."""
    weight = numpy_helper.from_array(np.eye(width, dtype=np.float32), "W")
    names = ["INPUT0", *(f"h{i}" for i in range(1, matmuls)), "OUTPUT0"]
    nodes = [helper.make_node("MatMul", [a, "W"], [b]) for a, b in pairwise(names)]
    graph = helper.make_graph(
        nodes,
        "slow",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", width])],
        [weight],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", make_models.OPSET)])
    model.ir_version = make_models.IR_VERSION
    make_models.save(model, root / "slow" / "1" / "model.onnx")
    (root / "slow" / "config.pbtxt").write_text(
        "max_batch_size: 256\ninstance_group [ { kind: KIND_CPU count: 1 } ]\n"
    )
    return root


def build_napping_repository(root: Path, seconds_per_row: float) -> Path:
    """``slow`` as ``build_slow_repository`` serves it (FP32 [batch, 2048], one instance), but
    a python model that sleeps ``seconds_per_row`` for each row of a batch: a request that
    keeps the instance busy for seconds without taking the cores from the tests beside it."""
    make_models.write_text(
        'name: "slow"\nbackend: "python"\nmax_batch_size: 256\n'
        'input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 2048 ] } ]\n'
        'output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 2048 ] } ]\n' + _ONE_INSTANCE,
        root / "slow" / "config.pbtxt",
    )
    make_models.write_text(
        _NAPPING.replace("SECONDS_PER_ROW", repr(seconds_per_row)), root / "slow" / "1" / "model.py"
    )
    return root


def slow_http_request(rows: int, request_id: str) -> bytes:
    """A whole raw HTTP request for ``slow`` with ``rows`` rows of ones, binary in and out."""
    width = 2048
    header = {
        "id": request_id,
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [rows, width],
                "parameters": {"binary_data_size": rows * width * 4},
            }
        ],
        "parameters": {"binary_data_output": True},
    }
    text = json.dumps(header).encode()
    head = (
        f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: x\r\n"
        f"Content-Length: {len(text) + rows * width * 4}\r\n"
        f"Inference-Header-Content-Length: {len(text)}\r\n\r\n"
    ).encode()
    return head + text + np.ones((rows, width), np.float32).tobytes()


def spin_model(iterations: int) -> onnx.ModelProto:
    """FP32 [1] -> [1]: a Loop adding one ``iterations`` times, which keeps ONNX Runtime busy
    for about a microsecond per iteration (a long execution in a file of a few hundred bytes)."""
    one = numpy_helper.from_array(np.array([1.0], dtype=np.float32), "one")
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["x_in", "one"], ["x_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("iteration", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("x_out", TensorProto.FLOAT, [1]),
        ],
        [one],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "INPUT0"], ["OUTPUT0"], body=body)],
        "spin",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, [1])],
        [numpy_helper.from_array(np.array(iterations, dtype=np.int64), "trips")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", make_models.OPSET)])
    model.ir_version = make_models.IR_VERSION
    return model


_ONE_INSTANCE = "instance_group [ { kind: KIND_CPU count: 1 } ]\n"
_PYTHON_IO = """backend: "python"
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
"""
_SLEEPY = """import time


class TensorgateModel:
    def execute(self, inputs):
        time.sleep(30)
        return {"OUTPUT0": inputs["INPUT0"]}
"""
_NAPPING = """import time


class TensorgateModel:
    def execute(self, inputs):
        time.sleep(SECONDS_PER_ROW * len(inputs["INPUT0"]))
        return {"OUTPUT0": inputs["INPUT0"]}
"""
_SLOW_START = """import time


class TensorgateModel:
    def initialize(self, config):
        print("initializing slow_start", flush=True)
        time.sleep(30)

    def execute(self, inputs):
        return {"OUTPUT0": inputs["INPUT0"]}
"""


def build_busy_repository(root: Path) -> Path:
    """Models that keep their one instance busy for half a minute: ``sleepy`` (a python model
    whose ``execute`` sleeps 30 s) and ``spin`` (ONNX Runtime looping for about as long); both
    FP32 [1] in and out, no batching."""
    config = f'name: "sleepy"\n{_PYTHON_IO}{_ONE_INSTANCE}'
    make_models.write_text(config, root / "sleepy" / "config.pbtxt")
    make_models.write_text(_SLEEPY, root / "sleepy" / "1" / "model.py")
    make_models.save(spin_model(30_000_000), root / "spin" / "1" / "model.onnx")
    make_models.write_text(
        'name: "spin"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 0\n' + _ONE_INSTANCE,
        root / "spin" / "config.pbtxt",
    )
    return root


def build_slow_start_repository(root: Path) -> Path:
    """``slow_start``: a python model whose ``initialize`` prints ``initializing slow_start``
    and then sleeps 30 s (a load in progress)."""
    config = f'name: "slow_start"\n{_PYTHON_IO}{_ONE_INSTANCE}'
    make_models.write_text(config, root / "slow_start" / "config.pbtxt")
    make_models.write_text(_SLOW_START, root / "slow_start" / "1" / "model.py")
    return root
