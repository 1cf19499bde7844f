"""Unit tests for server.protocol.proto_json: protobuf JSON with Triton's 64-bit numbers."""

from __future__ import annotations

from typing import Any

import pytest
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    text_format,
    wrappers_pb2,
)
from google.protobuf.message import Message

from server.generated import grpc_service_pb2 as pb
from server.generated import model_config_pb2 as mc
from server.protocol.proto_json import message_to_json
from server.repository.config import to_json

# ---- a test message holding every kind of 64-bit field --------------------------------------

_F = descriptor_pb2.FieldDescriptorProto


def _field(
    message: descriptor_pb2.DescriptorProto,
    name: str,
    number: int,
    kind: int,
    *,
    repeated: bool = False,
    type_name: str | None = None,
    oneof: int | None = None,
) -> None:
    field = message.field.add(name=name, number=number, type=kind)
    field.label = _F.LABEL_REPEATED if repeated else _F.LABEL_OPTIONAL
    if type_name is not None:
        field.type_name = type_name
    if oneof is not None:
        field.oneof_index = oneof


def _build_test_message() -> type[Message]:
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(wrappers_pb2.DESCRIPTOR.serialized_pb)
    proto = descriptor_pb2.FileDescriptorProto(
        name="proto_json_test.proto",
        package="pjtest",
        syntax="proto3",
        dependency=["google/protobuf/wrappers.proto"],
    )
    inner = proto.message_type.add(name="Inner")
    _field(inner, "u", 1, _F.TYPE_UINT64)
    _field(inner, "kept", 2, _F.TYPE_INT64)
    _field(inner, "small", 3, _F.TYPE_INT32)

    outer = proto.message_type.add(name="Outer")
    _field(outer, "i64", 1, _F.TYPE_INT64)
    _field(outer, "u64", 2, _F.TYPE_UINT64)
    _field(outer, "s64", 3, _F.TYPE_SINT64)
    _field(outer, "f64", 4, _F.TYPE_FIXED64)
    _field(outer, "sf64", 5, _F.TYPE_SFIXED64)
    _field(outer, "rep", 6, _F.TYPE_INT64, repeated=True)
    _field(outer, "sub", 7, _F.TYPE_MESSAGE, type_name=".pjtest.Inner")
    _field(outer, "subs", 8, _F.TYPE_MESSAGE, type_name=".pjtest.Inner", repeated=True)
    maps = [
        ("num_map", "NumMapEntry", _F.TYPE_INT64, None),
        ("kept_map", "KeptMapEntry", _F.TYPE_INT64, None),
        ("msg_map", "MsgMapEntry", _F.TYPE_MESSAGE, ".pjtest.Inner"),
    ]
    for number, (name, entry_name, value_kind, value_type) in enumerate(maps, start=9):
        entry = outer.nested_type.add(name=entry_name)
        entry.options.map_entry = True
        _field(entry, "key", 1, _F.TYPE_STRING)
        _field(entry, "value", 2, value_kind, type_name=value_type)
        _field(
            outer,
            name,
            number,
            _F.TYPE_MESSAGE,
            type_name=f".pjtest.Outer.{entry_name}",
            repeated=True,
        )
    outer.oneof_decl.add(name="choice")
    _field(outer, "one_i64", 12, _F.TYPE_INT64, oneof=0)
    _field(outer, "one_str", 13, _F.TYPE_STRING, oneof=0)
    _field(outer, "wrapped", 14, _F.TYPE_MESSAGE, type_name=".google.protobuf.Int64Value")
    pool.AddSerializedFile(proto.SerializeToString())
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("pjtest.Outer"))


Outer = _build_test_message()
BIG = 2**63 - 1  # past 2**53: must stay exact
HUGE = 2**64 - 1


def _outer() -> Message:
    message = Outer()
    text_format.Parse(
        f"""
        i64: -5 u64: {HUGE} s64: -7 f64: 8 sf64: {-BIG}
        rep: [1, -2, {BIG}]
        sub {{ u: 3 kept: 4 small: 5 }}
        subs {{ u: 6 }} subs {{ kept: 7 }}
        num_map {{ key: "a" value: 9 }}
        kept_map {{ key: "b" value: 10 }}
        msg_map {{ key: "c" value {{ u: 11 kept: 12 }} }}
        one_i64: 13
        wrapped {{ value: 14 }}
        """,
        message,
    )
    return message


def test_every_64_bit_kind_becomes_a_number() -> None:
    data = message_to_json(_outer())
    assert data["i64"] == -5
    assert data["u64"] == HUGE
    assert data["s64"] == -7
    assert data["f64"] == 8
    assert data["sf64"] == -BIG
    assert data["rep"] == [1, -2, BIG]
    assert data["sub"] == {"u": 3, "kept": 4, "small": 5}
    assert data["subs"] == [{"u": 6, "kept": 0, "small": 0}, {"u": 0, "kept": 7, "small": 0}]
    assert data["num_map"] == {"a": 9}
    assert data["kept_map"] == {"b": 10}
    assert data["msg_map"] == {"c": {"u": 11, "kept": 12, "small": 0}}
    assert data["one_i64"] == 13
    assert "one_str" not in data


def test_well_known_types_keep_protobuf_json() -> None:
    assert message_to_json(_outer())["wrapped"] == "14"


def test_named_fields_stay_strings() -> None:
    data = message_to_json(
        _outer(),
        {("pjtest.Outer", "rep"), ("pjtest.Inner", "kept"), ("pjtest.Outer", "kept_map")},
    )
    assert data["rep"] == ["1", "-2", str(BIG)]
    assert data["sub"] == {"u": 3, "kept": "4", "small": 5}
    assert data["subs"][1]["kept"] == "7"
    assert data["msg_map"] == {"c": {"u": 11, "kept": "12", "small": 0}}
    assert data["kept_map"] == {"b": "10"}
    assert data["num_map"] == {"a": 9}
    assert data["i64"] == -5


def test_a_set_of_pairs_works_too() -> None:
    keep = {("pjtest.Outer", "i64")}
    assert message_to_json(_outer(), keep)["i64"] == "-5"
    assert message_to_json(_outer(), frozenset(keep))["i64"] == "-5"


def test_defaults_printed_and_unset_messages_left_out() -> None:
    data = message_to_json(Outer())
    assert data == {
        "i64": 0,
        "u64": 0,
        "s64": 0,
        "f64": 0,
        "sf64": 0,
        "rep": [],
        "subs": [],
        "num_map": {},
        "kept_map": {},
        "msg_map": {},
    }


def test_field_names_preserved() -> None:
    data = message_to_json(pb.ModelMetadataResponse(name="m", versions=["1"]))
    assert data == {"name": "m", "versions": ["1"], "platform": "", "inputs": [], "outputs": []}


def test_grpc_messages() -> None:
    response = pb.ModelMetadataResponse()
    response.inputs.add(name="X", datatype="FP32", shape=[-1, 3])
    assert message_to_json(response)["inputs"] == [
        {"name": "X", "datatype": "FP32", "shape": [-1, 3]}
    ]
    request = pb.ModelInferRequest()
    request.parameters["p"].uint64_param = HUGE
    request.parameters["q"].int64_param = -1
    params = message_to_json(request)["parameters"]
    assert params == {"p": {"uint64_param": HUGE}, "q": {"int64_param": -1}}


# ---- equivalence with server.repository.config.to_json --------------------------------------

CONFIG_STRINGS = {
    ("inference.ModelOptimizationPolicy.Cuda.GraphSpec.Shape", "dim"),
    ("inference.ModelInstanceGroup.SecondaryDevice", "device_id"),
}

CONFIGS = [
    "",
    'name: "m" max_batch_size: 4 input { name: "X" data_type: TYPE_FP32 dims: [ -1 ] }',
    """
    name: "m"
    platform: "onnxruntime_onnx"
    max_batch_size: 4
    version_policy { specific { versions: [ 1, 3 ] } }
    input { name: "I" data_type: TYPE_FP32 dims: [ -1, 3 ] reshape { shape: [ 3, -1 ] } }
    output { name: "O" data_type: TYPE_INT64 dims: [ 2 ] }
    dynamic_batching {
      preferred_batch_size: [ 2, 4 ]
      max_queue_delay_microseconds: 100
      priority_levels: 2
      default_priority_level: 1
      default_queue_policy { default_timeout_microseconds: 5 timeout_action: DELAY }
      priority_queue_policy { key: 1 value { default_timeout_microseconds: 7 max_queue_size: 3 } }
    }
    instance_group {
      kind: KIND_CPU count: 1
      secondary_devices { kind: KIND_NVDLA device_id: 3 }
    }
    optimization {
      cuda {
        graph_spec {
          batch_size: 8
          input { key: "I" value { dim: [ 4 ] } }
          graph_lower_bound { batch_size: 2 input { key: "I" value { dim: [ 1 ] } } }
        }
      }
    }
    parameters { key: "k" value { string_value: "v" } }
    """,
    """
    name: "seq"
    backend: "python"
    max_batch_size: 2
    input { name: "I" data_type: TYPE_STRING dims: [ 1 ] }
    output { name: "O" data_type: TYPE_STRING dims: [ 1 ] }
    sequence_batching {
      max_sequence_idle_microseconds: 5000000
      control_input { name: "START" control { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } }
      oldest { max_candidate_sequences: 4 preferred_batch_size: [ 2 ] }
    }
    model_warmup {
      name: "w" batch_size: 1
      inputs { key: "I" value { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } }
    }
    response_cache { enable: true }
    model_transaction_policy { decoupled: false }
    """,
]


@pytest.mark.parametrize("text", CONFIGS)
def test_matches_config_to_json(text: str) -> None:
    config = text_format.Parse(text, mc.ModelConfig())
    expected: dict[str, Any] = to_json(config)
    assert message_to_json(config, CONFIG_STRINGS) == expected
