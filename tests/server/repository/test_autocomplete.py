"""Unit tests for server.repository.autocomplete (ONNX Runtime backend rules, triton-facts §3.4)."""

from __future__ import annotations

import logging

import pytest
from google.protobuf import text_format

from backends.base import ModelSignature, TensorInfo
from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.protocol import datatypes
from server.repository.autocomplete import autocomplete

DT = datatypes.BY_NAME


def _config(text: str = 'name: "m"') -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def _sig(
    inputs: list[tuple[str, str, tuple[int, ...]]], outputs: list[tuple[str, str, tuple[int, ...]]]
) -> ModelSignature:
    return ModelSignature(
        tuple(TensorInfo(n, DT[d], s) for n, d, s in inputs),
        tuple(TensorInfo(n, DT[d], s) for n, d, s in outputs),
    )


BATCHABLE = _sig(
    [("INPUT0", "FP32", (-1, 16)), ("INPUT1", "BYTES", (-1, -1))],
    [("OUTPUT0", "INT64", (-1, 3, 4))],
)
FIXED = _sig([("X", "FP16", (2, 8))], [("Y", "BF16", (2, 8))])


def test_batchable_model_gets_default_max_batch_and_dynamic_batching(
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = _config()
    with caplog.at_level(logging.WARNING):
        autocomplete(config, BATCHABLE, 4)
    assert config.max_batch_size == 4
    assert config.HasField("dynamic_batching")
    assert config.dynamic_batching == mc.ModelDynamicBatching()
    assert "autofilled max_batch_size to 4 for model 'm'" in caplog.text


def test_batchable_dims_exclude_the_batch_dim() -> None:
    config = _config()
    autocomplete(config, BATCHABLE, 4)
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("INPUT0", mc.TYPE_FP32, [16]),
        ("INPUT1", mc.TYPE_STRING, [-1]),
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [
        ("OUTPUT0", mc.TYPE_INT64, [3, 4]),
    ]
    assert not any(t.HasField("reshape") for t in [*config.input, *config.output])


def test_default_max_batch_is_a_parameter() -> None:
    config = _config()
    autocomplete(config, BATCHABLE, 32)
    assert config.max_batch_size == 32


def test_given_max_batch_size_kept() -> None:
    config = _config('name: "m" max_batch_size: 8')
    autocomplete(config, BATCHABLE, 4)
    assert config.max_batch_size == 8
    assert config.HasField("dynamic_batching")
    assert list(config.input[0].dims) == [16]


def test_max_batch_size_one_gets_no_dynamic_batching() -> None:
    config = _config('name: "m" max_batch_size: 1')
    autocomplete(config, BATCHABLE, 4)
    assert config.max_batch_size == 1
    assert config.WhichOneof("scheduling_choice") is None
    assert list(config.input[0].dims) == [16]


def test_existing_scheduler_is_kept() -> None:
    config = _config('name: "m" sequence_batching { }')
    autocomplete(config, BATCHABLE, 4)
    assert config.max_batch_size == 4
    assert config.WhichOneof("scheduling_choice") == "sequence_batching"


def test_existing_dynamic_batching_settings_kept() -> None:
    config = _config('name: "m" dynamic_batching { max_queue_delay_microseconds: 50 }')
    autocomplete(config, BATCHABLE, 4)
    assert config.dynamic_batching.max_queue_delay_microseconds == 50


def test_non_batchable_model() -> None:
    config = _config()
    autocomplete(config, FIXED, 4)
    assert config.max_batch_size == 0
    assert config.WhichOneof("scheduling_choice") is None
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("X", mc.TYPE_FP16, [2, 8])
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [
        ("Y", mc.TYPE_BF16, [2, 8])
    ]


@pytest.mark.parametrize(
    "signature",
    [
        # one output without a variable leading dim
        _sig([("A", "FP32", (-1, 4))], [("B", "FP32", (4,))]),
        # one input with a fixed leading dim
        _sig([("A", "FP32", (-1, 4)), ("C", "FP32", (1, 4))], [("B", "FP32", (-1, 4))]),
        # a scalar input
        _sig([("A", "FP32", ())], [("B", "FP32", (-1,))]),
        # variable dim, but not the first
        _sig([("A", "FP32", (4, -1))], [("B", "FP32", (4, -1))]),
    ],
)
def test_batching_needs_every_tensor_with_variable_leading_dim(signature: ModelSignature) -> None:
    config = _config()
    autocomplete(config, signature, 4)
    assert config.max_batch_size == 0
    assert not config.HasField("dynamic_batching")


def test_non_batchable_with_max_batch_size_is_an_error() -> None:
    config = _config('name: "fixed" max_batch_size: 4')
    with pytest.raises(ModelLoadError) as err:
        autocomplete(config, FIXED, 4)
    assert str(err.value) == (
        "autofill failed for model 'fixed': model does not support batching while non-zero "
        "max_batch_size is specified"
    )


def test_scalar_with_batching_becomes_dims_one_and_reshape() -> None:
    signature = _sig([("S", "INT32", (-1,))], [("T", "INT32", (-1,))])
    config = _config()
    autocomplete(config, signature, 4)
    assert config.max_batch_size == 4
    for tensor in (config.input[0], config.output[0]):
        assert list(tensor.dims) == [1]
        assert tensor.HasField("reshape")
        assert list(tensor.reshape.shape) == []


def test_scalar_without_batching_becomes_dims_one() -> None:
    signature = _sig([("S", "FP64", ())], [("T", "FP64", ())])
    config = _config()
    autocomplete(config, signature, 4)
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [1]
    assert list(config.output[0].dims) == [1]
    # the model takes a rank-0 tensor: the client's [1] must be reshaped to []
    assert config.input[0].HasField("reshape") and list(config.input[0].reshape.shape) == []


def test_default_max_batch_zero_keeps_batch_dim_in_dims() -> None:
    config = _config()
    autocomplete(config, BATCHABLE, 0)
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [-1, 16]
    assert not config.HasField("dynamic_batching")


def test_complete_config_is_left_alone() -> None:
    text = (
        'name: "m" '
        'input { name: "MINE" data_type: TYPE_INT8 dims: [ 7 ] } '
        'output { name: "OUT" data_type: TYPE_INT8 dims: [ 7 ] }'
    )
    config = _config(text)
    autocomplete(config, BATCHABLE, 4)
    assert config == _config(text)  # no max_batch_size, no dynamic_batching, no tensors added


def test_complete_config_with_non_batchable_model_and_max_batch_not_checked() -> None:
    text = (
        'name: "m" max_batch_size: 4 '
        'input { name: "X" data_type: TYPE_FP16 dims: [ 8 ] } '
        'output { name: "Y" data_type: TYPE_BF16 dims: [ 8 ] }'
    )
    config = _config(text)
    autocomplete(config, FIXED, 4)
    assert config == _config(text)


def test_batch_input_counts_as_input() -> None:
    text = (
        'name: "m" batch_input { kind: BATCH_ELEMENT_COUNT target_name: "N" data_type: TYPE_INT32 } '
        'output { name: "OUT" data_type: TYPE_INT8 dims: [ 7 ] }'
    )
    config = _config(text)
    autocomplete(config, BATCHABLE, 4)
    assert config == _config(text)


def test_only_outputs_missing_are_filled() -> None:
    config = _config(
        'name: "m" max_batch_size: 2 input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }'
    )
    autocomplete(config, BATCHABLE, 4)
    assert [t.name for t in config.input] == ["INPUT0"]
    assert [(t.name, list(t.dims)) for t in config.output] == [("OUTPUT0", [3, 4])]
    assert config.max_batch_size == 2
    assert config.HasField("dynamic_batching")


def test_only_inputs_missing_are_filled() -> None:
    config = _config('name: "m" output { name: "OUTPUT0" data_type: TYPE_INT64 dims: [ 3, 4 ] }')
    autocomplete(config, BATCHABLE, 4)
    assert [t.name for t in config.input] == ["INPUT0", "INPUT1"]
    assert len(config.output) == 1
    assert config.max_batch_size == 4


@pytest.mark.parametrize("name", sorted(DT))
def test_every_datatype_maps_to_its_config_type(name: str) -> None:
    signature = _sig([("I", name, (3,))], [("O", name, (3,))])
    config = _config()
    autocomplete(config, signature, 4)
    assert mc.DataType.Name(config.input[0].data_type) == DT[name].config_name
    assert mc.DataType.Name(config.output[0].data_type) == DT[name].config_name


def test_empty_signature_is_not_batchable() -> None:
    config = _config()
    autocomplete(config, ModelSignature((), ()), 4)
    assert config.max_batch_size == 0
    assert len(config.input) == 0 and len(config.output) == 0


def test_sequence_control_and_state_tensors_are_not_client_tensors() -> None:
    config = _config(
        'name: "m" sequence_batching { control_input [ { name: "START" control [ { kind: '
        "CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] state [ { input_name: "
        '"S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 2 ] } ] }'
    )
    signature = _sig(
        [("INPUT", "INT32", (-1, 1)), ("START", "INT32", (-1, 1)), ("S_IN", "FP32", (-1, 2))],
        [("OUTPUT", "INT32", (-1, 1)), ("S_OUT", "FP32", (-1, 2))],
    )
    autocomplete(config, signature, 4)
    assert [t.name for t in config.input] == ["INPUT"]
    assert [t.name for t in config.output] == ["OUTPUT"]
    assert config.max_batch_size == 4
    assert config.WhichOneof("scheduling_choice") == "sequence_batching"
