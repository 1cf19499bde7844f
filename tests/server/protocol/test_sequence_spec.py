"""``sequence_batching`` configs: what is read from them, what Triton refuses (its texts), and
the sequence request parameters."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from google.protobuf import text_format

from server.errors import InvalidArgument, ModelLoadError
from server.generated import model_config_pb2 as mc
from server.protocol import sequence_spec
from server.protocol.parameters import check_request_parameters, sequence_of
from server.protocol.sequence_spec import SequenceSpec


def _config(sequence: str, extra: str = "max_batch_size: 4") -> mc.ModelConfig:
    config = mc.ModelConfig()
    text_format.Parse(
        f'name: "m" {extra} input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ] '
        f"sequence_batching {{ {sequence} }}",
        config,
    )
    return config


def _control(name: str, kind: str, values: str) -> str:
    return f'control_input [ {{ name: "{name}" control [ {{ kind: {kind} {values} }} ] }} ]'


def test_controls_and_states_are_read() -> None:
    config = _config(
        _control("S", "CONTROL_SEQUENCE_START", "fp32_false_true: [ 0.5, 2 ]")
        + _control("C", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_STRING")
        + ' state [ { input_name: "SI" output_name: "SO" data_type: TYPE_FP16 dims: [ 2, 3 ] } ]'
        + " oldest { max_candidate_sequences: 3 }"
    )
    sequence_spec.validate(config)
    spec = SequenceSpec.from_config(config)
    assert spec.oldest and spec.max_candidate_sequences == 3 and spec.idle_us == 1_000_000
    assert spec.start is not None and spec.end is None and spec.ready is None
    start = spec.start.tensor(True, batching=True)
    assert start.dtype == np.float32 and start.tolist() == [[2.0]]
    assert spec.start.tensor(False, batching=False).tolist() == [0.5]
    assert spec.corrid is not None and spec.corrid.tensor(12, True).tolist() == [[b"12"]]
    (state,) = spec.states
    initial = state.initial(batching=True)
    assert initial.shape == (1, 2, 3) and initial.dtype == np.float16 and not initial.any()
    assert sequence_spec.supplied_inputs(config) == {
        "S": spec.start.datatype, "C": spec.corrid.datatype, "SI": state.datatype,
    }
    assert list(sequence_spec.supplied_outputs(config)) == ["SO"]


@pytest.mark.parametrize(
    "sequence, message",
    [
        (
            _control("S", "CONTROL_SEQUENCE_START", ""),
            ("sequence batching must specify either 'int32_false_true', 'fp32_false_true' or "
             "'bool_false_true' for CONTROL_SEQUENCE_START for m"),
        ),
        (
            _control("S", "CONTROL_SEQUENCE_END", "int32_false_true: [ 0, 1, 2 ]"),
            ("sequence batching control 'int32_false_true' must have exactly 2 entries for "
             "CONTROL_SEQUENCE_END for m"),
        ),
        (
            _control("S", "CONTROL_SEQUENCE_READY",
                     "int32_false_true: [ 0, 1 ] bool_false_true: [ false, true ]"),
            ("sequence batching specifies more than one from 'int32_false_true', "
             "'fp32_false_true' and 'bool_false_true' for CONTROL_SEQUENCE_READY for m"),
        ),
        (
            _control("C", "CONTROL_SEQUENCE_CORRID", "data_type: TYPE_FP32"),
            ("unexpected data type for control CONTROL_SEQUENCE_CORRID for m. Allowed data types "
             "are TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 and TYPE_STRING"),
        ),
        (
            _control("C", "CONTROL_SEQUENCE_CORRID",
                     "data_type: TYPE_UINT64 int32_false_true: [ 0, 1 ]"),
            ("sequence batching must not specify either 'int32_false_true', 'fp32_false_true' "
             "or 'bool_false_true' for CONTROL_SEQUENCE_CORRID for m"),
        ),
        (
            _control("A", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1 ]")
            + _control("B", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1 ]"),
            "sequence batching specifies multiple CONTROL_SEQUENCE_START tensors for m",
        ),
        (
            _control("A", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1 ]")
            + _control("A", "CONTROL_SEQUENCE_END", "int32_false_true: [ 0, 1 ]"),
            "sequence batching control tensor 'A' is specified for multiple control kinds for m",
        ),
        (
            "oldest { preferred_batch_size: [ 8 ] }",
            "sequence batching preferred batch size must be <= max batch size for m",
        ),
        (
            "direct { minimum_slot_utilization: 1.5 }",
            "sequence batching minimum slot utilization must be in range (0.0, 1.0] for m",
        ),
        (
            _control("IN", "CONTROL_SEQUENCE_START", "int32_false_true: [ 0, 1 ]"),
            "sequence batching control tensor 'IN' of model 'm' is also declared as an input",
        ),
        (
            'state [ { input_name: "S" output_name: "T" data_type: TYPE_INT32 dims: [ -1 ] } ]',
            "state 'S' of model 'm' has variable dims [-1]",
        ),
        (
            ('state [ { input_name: "S" output_name: "T" data_type: TYPE_INT32 dims: [ 1 ] '
             'initial_state [ { data_type: TYPE_INT32 dims: [ 2 ] data_file: "f" } ] } ]'),
            "state 'S' of model 'm': its initial_state must have the state's data_type and dims",
        ),
        (
            ('state [ { input_name: "S" output_name: "T" data_type: TYPE_STRING dims: [ 1 ] '
             'initial_state [ { data_type: TYPE_STRING dims: [ 1 ] data_file: "f" } ] } ]'),
            "state 'S' of model 'm': an initial_state data_file of TYPE_STRING is not supported",
        ),
    ],
)
def test_refused_configs(sequence: str, message: str) -> None:
    with pytest.raises(ModelLoadError) as caught:
        sequence_spec.validate(_config(sequence))
    assert caught.value.message.startswith(message), caught.value.message


def test_response_cache_is_refused_with_sequence_batching() -> None:
    with pytest.raises(ModelLoadError, match="Response Cache does not currently support model m"):
        sequence_spec.validate(_config("", "max_batch_size: 4 response_cache { enable: true }"))


@pytest.mark.parametrize(
    "params, expected",
    [
        ({}, (0, False, False)),
        ({"sequence_id": 7, "sequence_start": True}, (7, True, False)),
        ({"sequence_id": "x", "sequence_end": True}, ("x", False, True)),
        ({"sequence_id": (1 << 64) - 1}, ((1 << 64) - 1, False, False)),
    ],
)
def test_sequence_parameters(params: dict[str, Any], expected: tuple[Any, ...]) -> None:
    check_request_parameters(params)
    assert sequence_of(params) == expected


@pytest.mark.parametrize(
    "params, key",
    [
        ({"sequence_id": -1}, "sequence_id"),
        ({"sequence_id": 1 << 64}, "sequence_id"),
        ({"sequence_id": False}, "sequence_id"),
        ({"sequence_id": [1]}, "sequence_id"),
        ({"sequence_start": 1}, "sequence_start"),
        ({"sequence_end": None}, "sequence_end"),
    ],
)
def test_bad_sequence_parameters(params: dict[str, Any], key: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_request_parameters(params)
    assert caught.value.message == f"Unable to parse '{key}'"
