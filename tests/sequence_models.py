"""ONNX stand-ins for Triton's example sequence models, with their Triton configs.

Triton's ``simple_sequence``, ``simple_dyna_sequence`` and ``simple_string_dyna_sequence`` are
custom C++ backends; these graphs answer NVIDIA's sequence example clients the same way:

- ``simple_sequence`` (Direct, START and READY): OUTPUT = (INPUT + START) * READY;
- ``simple_dyna_sequence`` (Oldest, START, END, READY, CORRID UINT64):
  OUTPUT = (INPUT + START + END * CORRID) * READY;
- ``simple_string_dyna_sequence`` (Oldest, CORRID STRING, implicit state ACC): the running sum
  of the sequence's inputs, plus the correlation ID (a decimal string) on its END request.

Control and state inputs are model inputs only: the configs do not declare them as inputs.
``py_sequence`` is a Triton-style python model that keeps its own running sum per correlation
ID (Triton's way for python models), checking that the CORRID control agrees with the
request's ``correlation_id()``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from scripts import make_models

_ROW: list[str | int | None] = ["batch", 1]

SIMPLE_SEQUENCE = """name: "simple_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {{
  max_sequence_idle_microseconds: {idle}
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: {count} }} ]
"""

_DYNA_CONTROLS = """  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }} ] }}
  ]
"""

SIMPLE_DYNA_SEQUENCE = (
    """name: "simple_dyna_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {{
  oldest {{ max_candidate_sequences: 4 preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 2000 }}
"""
    + _DYNA_CONTROLS.replace("{corrid}", "TYPE_UINT64")
    + """}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 1 }} ]
"""
)

SIMPLE_STRING_DYNA_SEQUENCE = (
    """name: "simple_string_dyna_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {{
  oldest {{ max_candidate_sequences: 4 max_queue_delay_microseconds: 2000 }}
"""
    + _DYNA_CONTROLS.replace("{corrid}", "TYPE_STRING")
    + """  state [ {{ input_name: "ACC_IN" output_name: "ACC_OUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
}}
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
instance_group [ {{ kind: KIND_CPU count: 2 }} ]
"""
)


def _int32(name: str) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, TensorProto.INT32, _ROW)


def _model(nodes: list[onnx.NodeProto], name: str, inputs: list[onnx.ValueInfoProto],
           outputs: list[onnx.ValueInfoProto]) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", make_models.OPSET)])
    model.ir_version = make_models.IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def simple_sequence_model() -> onnx.ModelProto:
    return _model(
        [
            helper.make_node("Add", ["INPUT", "START"], ["plus_start"]),
            helper.make_node("Mul", ["plus_start", "READY"], ["OUTPUT"]),
        ],
        "simple_sequence",
        [_int32("INPUT"), _int32("START"), _int32("READY")],
        [_int32("OUTPUT")],
    )


def dyna_sequence_model() -> onnx.ModelProto:
    return _model(
        [
            helper.make_node("Cast", ["CORRID"], ["corrid"], to=TensorProto.INT32),
            helper.make_node("Mul", ["END", "corrid"], ["end_id"]),
            helper.make_node("Add", ["INPUT", "START"], ["plus_start"]),
            helper.make_node("Add", ["plus_start", "end_id"], ["sum"]),
            helper.make_node("Mul", ["sum", "READY"], ["OUTPUT"]),
        ],
        "simple_dyna_sequence",
        [
            _int32("INPUT"), _int32("START"), _int32("END"), _int32("READY"),
            helper.make_tensor_value_info("CORRID", TensorProto.UINT64, _ROW),
        ],
        [_int32("OUTPUT")],
    )


def string_dyna_sequence_model() -> onnx.ModelProto:
    """ACC_OUT = ACC_IN + INPUT (the state is zeros at START); OUTPUT adds int(CORRID) on END."""
    return _model(
        [
            helper.make_node("Add", ["ACC_IN", "INPUT"], ["ACC_OUT"]),
            helper.make_node("Cast", ["CORRID"], ["corrid"], to=TensorProto.INT32),
            helper.make_node("Mul", ["END", "corrid"], ["end_id"]),
            helper.make_node("Add", ["ACC_OUT", "end_id"], ["OUTPUT"]),
        ],
        "simple_string_dyna_sequence",
        [
            _int32("INPUT"), _int32("START"), _int32("END"), _int32("READY"),
            helper.make_tensor_value_info("CORRID", TensorProto.STRING, _ROW),
            _int32("ACC_IN"),
        ],
        [_int32("OUTPUT"), _int32("ACC_OUT")],
    )


def build_sequence_repository(root: Path, idle_us: int = 5_000_000, count: int = 1) -> Path:
    """The three models with their configs (``simple_sequence``: ``idle_us`` and ``count``
    instances)."""
    for name, model, config in (
        ("simple_sequence", simple_sequence_model(), SIMPLE_SEQUENCE),
        ("simple_dyna_sequence", dyna_sequence_model(), SIMPLE_DYNA_SEQUENCE),
        ("simple_string_dyna_sequence", string_dyna_sequence_model(),
         SIMPLE_STRING_DYNA_SEQUENCE),
    ):
        make_models.save(model, root / name / "1" / "model.onnx")
        make_models.write_text(
            config.format(idle=idle_us, count=count), root / name / "config.pbtxt"
        )
    return root


def row(value: int) -> np.ndarray:
    """One request's INPUT, as NVIDIA's clients send it: shape [1, 1]."""
    return np.full((1, 1), value, dtype=np.int32)


PY_SEQUENCE_CONFIG = """name: "py_sequence"
backend: "python"
max_batch_size: 4
sequence_batching {
  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START bool_false_true: [ false, true ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
}
input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

PY_SEQUENCE = """import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            start = pb_utils.get_input_tensor_by_name(request, "START").as_numpy()
            end = pb_utils.get_input_tensor_by_name(request, "END").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            key = request.correlation_id()
            if int(corrid[0][0]) != key:
                raise pb_utils.TritonModelException("CORRID differs from correlation_id()")
            total = (0 if start[0][0] else self.sums.get(key, 0)) + int(value[0][0])
            self.sums[key] = total
            if end[0][0]:
                del self.sums[key]
            out = np.full((1, 1), total, dtype=np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
"""


def build_python_sequence(root: Path) -> Path:
    """``py_sequence`` in ``root``."""
    make_models.write_text(PY_SEQUENCE_CONFIG, root / "py_sequence" / "config.pbtxt")
    make_models.write_text(PY_SEQUENCE, root / "py_sequence" / "1" / "model.py")
    return root
