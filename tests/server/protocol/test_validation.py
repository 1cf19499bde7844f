"""Unit tests for server.protocol.validation: requests checked against the model config."""

from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from server.errors import InvalidArgument
from server.generated import model_config_pb2
from server.protocol import datatypes
from server.protocol.model_spec import ModelSpec
from server.protocol.types import InferRequest, InputTensor, RequestedOutput
from server.protocol.validation import PreparedRequest, validate
from tests.triton_texts import BATCH_NOTE, NO_ID

DT = datatypes.BY_NAME


def _config(text: str) -> ModelSpec:
    return ModelSpec.from_config(text_format.Parse(text, model_config_pb2.ModelConfig()))


SIMPLE = _config(
    """
    name: "simple"
    max_batch_size: 8
    input { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }
    input { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
    output { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }
    output { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] }
    """
)

NOBATCH = _config(
    """
    name: "nobatch"
    max_batch_size: 0
    input { name: "X" data_type: TYPE_FP32 dims: [ 2, -1 ] }
    output { name: "Y" data_type: TYPE_FP32 dims: [ 2, -1 ] }
    """
)


def _tensor(name: str, datatype: str, shape: tuple[int, ...]) -> InputTensor:
    dt = DT[datatype]
    count = int(np.prod(shape)) if shape else 1
    if dt.is_bytes:
        data = np.empty(count, dtype=object)
        data[:] = [b"x"] * count
    else:
        data = np.arange(count).astype(dt.dtype)
    return InputTensor(name, dt, shape, data.reshape(shape))


def _request(
    *inputs: InputTensor,
    outputs: list[RequestedOutput] | None = None,
    model: str = "simple",
    request_id: str | None = None,
) -> InferRequest:
    return InferRequest(model, "1", list(inputs), outputs, request_id)


def _simple(rows: int = 1) -> list[InputTensor]:
    return [_tensor("INPUT0", "INT32", (rows, 16)), _tensor("INPUT1", "INT32", (rows, 16))]


def _invalid(request: InferRequest, config: ModelSpec) -> str:
    with pytest.raises(InvalidArgument) as err:
        validate(request, config)
    assert err.value.http_status == 400
    return str(err.value)


# ---- success -------------------------------------------------------------------------------


def test_valid_request_prepared() -> None:
    inputs = _simple(3)
    prepared = validate(_request(*inputs), SIMPLE)
    assert isinstance(prepared, PreparedRequest)
    assert prepared.batch_size == 3
    assert set(prepared.inputs) == {"INPUT0", "INPUT1"}
    assert prepared.inputs["INPUT0"] is inputs[0].data  # no copy when nothing is reshaped
    assert prepared.output_names == ["OUTPUT0", "OUTPUT1"]


def test_inputs_in_any_order() -> None:
    a, b = _simple(2)
    assert validate(_request(b, a), SIMPLE).batch_size == 2


def test_requested_outputs_in_request_order() -> None:
    request = _request(*_simple(), outputs=[RequestedOutput("OUTPUT1"), RequestedOutput("OUTPUT0")])
    assert validate(request, SIMPLE).output_names == ["OUTPUT1", "OUTPUT0"]


def test_empty_requested_outputs_list_means_every_output() -> None:
    request = _request(*_simple(), outputs=[])
    assert validate(request, SIMPLE).output_names == ["OUTPUT0", "OUTPUT1"]


def test_non_batching_model_batch_size_one_and_variable_dim() -> None:
    prepared = validate(_request(_tensor("X", "FP32", (2, 7)), model="nobatch"), NOBATCH)
    assert prepared.batch_size == 1
    assert prepared.inputs["X"].shape == (2, 7)


def test_batch_of_max_batch_size_accepted() -> None:
    assert validate(_request(*_simple(8)), SIMPLE).batch_size == 8


def test_batch_of_zero_rows() -> None:
    assert validate(_request(*_simple(0)), SIMPLE).batch_size == 0


# ---- inputs: unknown, missing, duplicate ---------------------------------------------------


def test_unknown_input() -> None:
    request = _request(*_simple(), _tensor("INPUT9", "INT32", (1, 16)))
    assert _invalid(request, SIMPLE) == "unexpected inference input 'INPUT9' for model 'simple'"


def test_duplicate_input() -> None:
    a, b = _simple()
    request = _request(a, b, _tensor("INPUT0", "INT32", (1, 16)))
    assert _invalid(request, SIMPLE) == NO_ID + "input 'INPUT0' already exists in request"


THREE_REQUIRED = _config(
    """
    name: "input_all_required"
    max_batch_size: 0
    input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }
    input { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
    input { name: "INPUT2" data_type: TYPE_FP32 dims: [ 4 ] }
    output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }
    """
)

WITH_OPTIONAL = _config(
    """
    name: "input_optional"
    max_batch_size: 0
    input { name: "INPUT0" data_type: TYPE_FP32 dims: [ 4 ] }
    input { name: "INPUT1" data_type: TYPE_FP32 dims: [ 4 ] }
    input { name: "INPUT2" data_type: TYPE_FP32 dims: [ 4 ] }
    input { name: "INPUT3" data_type: TYPE_FP32 dims: [ 4 ] optional: true }
    output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }
    """
)

ALL_OPTIONAL = _config(
    """
    name: "all_optional"
    input { name: "A" data_type: TYPE_FP32 dims: [ 4 ] optional: true }
    input { name: "B" data_type: TYPE_FP32 dims: [ 4 ] optional: true }
    output { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 4 ] }
    """
)


def test_missing_all_required_inputs_triton_message() -> None:
    message = _invalid(_request(model="input_all_required"), THREE_REQUIRED)
    assert message == NO_ID + (
        "expected 3 inputs but got 0 inputs for model 'input_all_required'. Got input(s) [], but "
        "missing required input(s) ['INPUT0','INPUT1','INPUT2']. Please provide all required "
        "input(s)."
    )


def test_missing_some_required_inputs_triton_message() -> None:
    request = _request(_tensor("INPUT0", "FP32", (4,)), model="input_all_required")
    assert _invalid(request, THREE_REQUIRED) == NO_ID + (
        "expected 3 inputs but got 1 inputs for model 'input_all_required'. Got input(s) "
        "['INPUT0'], but missing required input(s) ['INPUT1','INPUT2']. Please provide all "
        "required input(s)."
    )


def test_missing_required_with_optional_inputs_message() -> None:
    message = _invalid(_request(model="input_optional"), WITH_OPTIONAL)
    assert message.startswith(
        NO_ID + "expected number of inputs between 3 and 4 but got 0 inputs for model 'input_optional'."
    )
    assert message.endswith("Please provide all required input(s).")


def test_optional_input_may_be_omitted_or_given() -> None:
    three = [_tensor(f"INPUT{i}", "FP32", (4,)) for i in range(3)]
    assert set(validate(_request(*three), WITH_OPTIONAL).inputs) == {"INPUT0", "INPUT1", "INPUT2"}
    four = [*three, _tensor("INPUT3", "FP32", (4,))]
    assert len(validate(_request(*four), WITH_OPTIONAL).inputs) == 4


def test_all_optional_and_none_given_is_valid() -> None:
    prepared = validate(_request(model="all_optional"), ALL_OPTIONAL)
    assert prepared.inputs == {}
    assert prepared.batch_size == 1
    assert prepared.output_names == ["OUTPUT0"]


# ---- datatype -------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", ["FP32", "INT64", "UINT32", "BYTES", "BOOL"])
def test_wrong_datatype(datatype: str) -> None:
    request = _request(_tensor("INPUT0", datatype, (1, 16)), _simple()[1])
    assert _invalid(request, SIMPLE) == NO_ID + (
        f"inference input 'INPUT0' data-type is '{datatype}', but model 'simple' expects 'INT32'"
    )


def test_bytes_config_type_string() -> None:
    config = _config(
        'name: "s" max_batch_size: 2 input { name: "S" data_type: TYPE_STRING dims: [ -1 ] } '
        'output { name: "O" data_type: TYPE_STRING dims: [ -1 ] }'
    )
    assert validate(_request(_tensor("S", "BYTES", (2, 3)), model="s"), config).batch_size == 2
    assert "expects 'BYTES'" in _invalid(_request(_tensor("S", "UINT8", (2, 3)), model="s"), config)


# ---- shape ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "shape,got", [((1, 8), "[1,8]"), ((1, 16, 1), "[1,16,1]"), ((16,), "[16]")]
)
def test_wrong_shape_with_batching(shape: tuple[int, ...], got: str) -> None:
    request = _request(_tensor("INPUT0", "INT32", shape), _simple()[1])
    message = _invalid(request, SIMPLE)
    if shape == (16,):
        # rank 1: 16 rows would exceed max_batch_size 8 before the shape is compared
        assert message == NO_ID + "inference request batch-size must be <= 8 for 'simple'"
    else:
        assert message == NO_ID + (
            f"unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got "
            f"{got}. {BATCH_NOTE}"
        )


def test_wrong_rank_small_batch() -> None:
    request = _request(_tensor("INPUT0", "INT32", (2,)), _tensor("INPUT1", "INT32", (2, 16)))
    assert _invalid(request, SIMPLE) == NO_ID + (
        f"unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [2]. "
        f"{BATCH_NOTE}"
    )


def test_scalar_input_for_batching_model() -> None:
    request = _request(_tensor("INPUT0", "INT32", ()), _simple()[1])
    assert _invalid(request, SIMPLE) == NO_ID + (
        "input 'INPUT0' has no shape but model requires batch dimension for 'simple'"
    )


@pytest.mark.parametrize("shape", [(3, 7), (2,), (2, 7, 1), ()])
def test_wrong_shape_without_batching(shape: tuple[int, ...]) -> None:
    got = "[" + ",".join(str(d) for d in shape) + "]"
    message = _invalid(_request(_tensor("X", "FP32", shape), model="nobatch"), NOBATCH)
    # Triton ends the text with ". " here too, where a batching model's note would follow.
    assert message == (
        f"{NO_ID}unexpected shape for input 'X' for model 'nobatch'. Expected [2,-1], got {got}. "
    )


def test_batch_larger_than_max_batch_size() -> None:
    assert _invalid(_request(*_simple(9)), SIMPLE) == NO_ID + (
        "inference request batch-size must be <= 8 for 'simple'"
    )


def test_inconsistent_batch_sizes() -> None:
    request = _request(_tensor("INPUT0", "INT32", (2, 16)), _tensor("INPUT1", "INT32", (3, 16)))
    assert _invalid(request, SIMPLE) == NO_ID + (
        "input 'INPUT1' batch size does not match other inputs for 'simple'"
    )


def test_refusals_name_the_request_by_its_id() -> None:
    """Triton's core begins these refusals with the request's id (the image client's batch of
    2 to densenet_onnx, max_batch_size 1, is answered so)."""
    too_many = _request(*_simple(9), request_id="1")
    assert _invalid(too_many, SIMPLE) == (
        "[request id: 1] inference request batch-size must be <= 8 for 'simple'"
    )
    wrong_type = _request(_tensor("INPUT0", "FP32", (1, 16)), _simple()[1], request_id="r 7")
    assert _invalid(wrong_type, SIMPLE).startswith("[request id: r 7] inference input 'INPUT0'")
    missing = _request(_simple()[0], request_id="")  # an empty id is no id
    assert _invalid(missing, SIMPLE).startswith(NO_ID + "expected 2 inputs but got 1 inputs")


def test_unknown_input_is_refused_without_the_request_id() -> None:
    """Triton refuses an input the model does not have before it looks at the request."""
    request = _request(_tensor("NOPE", "INT32", (1, 16)), _simple()[1], request_id="7")
    assert _invalid(request, SIMPLE) == "unexpected inference input 'NOPE' for model 'simple'"


# ---- outputs ---------------------------------------------------------------------------------


def test_unknown_output() -> None:
    request = _request(*_simple(), outputs=[RequestedOutput("OUTPUT0"), RequestedOutput("NOPE")])
    assert _invalid(request, SIMPLE) == "unexpected inference output 'NOPE' for model 'simple'"


def test_duplicate_output() -> None:
    request = _request(*_simple(), outputs=[RequestedOutput("OUTPUT0"), RequestedOutput("OUTPUT0")])
    assert _invalid(request, SIMPLE) == NO_ID + "output 'OUTPUT0' already exists in request"


# ---- reshape ----------------------------------------------------------------------------------


def test_reshape_to_scalar_with_batching() -> None:
    config = _config(
        'name: "r" max_batch_size: 4 '
        'input { name: "X" data_type: TYPE_FP32 dims: [ 1 ] reshape { } } '
        'output { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] reshape { } }'
    )
    tensor = _tensor("X", "FP32", (3, 1))
    prepared = validate(_request(tensor, model="r"), config)
    assert prepared.inputs["X"].shape == (3,)
    assert prepared.inputs["X"].tolist() == [0.0, 1.0, 2.0]
    assert np.shares_memory(prepared.inputs["X"], tensor.data)
    assert tensor.shape == (3, 1)  # the request itself is left alone


def test_reshape_to_scalar_without_batching() -> None:
    config = _config(
        'name: "r" input { name: "X" data_type: TYPE_INT64 dims: [ 1 ] reshape { } } '
        'output { name: "Y" data_type: TYPE_INT64 dims: [ 1 ] }'
    )
    prepared = validate(_request(_tensor("X", "INT64", (1,)), model="r"), config)
    assert prepared.inputs["X"].shape == ()


def test_reshape_keeps_batch_dim() -> None:
    config = _config(
        'name: "r" max_batch_size: 4 '
        'input { name: "X" data_type: TYPE_INT32 dims: [ 6 ] reshape { shape: [ 2, 3 ] } } '
        'output { name: "Y" data_type: TYPE_INT32 dims: [ 6 ] }'
    )
    prepared = validate(_request(_tensor("X", "INT32", (2, 6)), model="r"), config)
    assert prepared.inputs["X"].shape == (2, 2, 3)
    assert prepared.inputs["X"][1].tolist() == [[6, 7, 8], [9, 10, 11]]


def test_reshape_with_variable_dim() -> None:
    config = _config(
        'name: "r" max_batch_size: 4 '
        'input { name: "X" data_type: TYPE_INT32 dims: [ -1 ] reshape { shape: [ -1, 2 ] } } '
        'output { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] }'
    )
    prepared = validate(_request(_tensor("X", "INT32", (1, 8)), model="r"), config)
    assert prepared.inputs["X"].shape == (1, 4, 2)


def test_reshape_impossible_is_invalid_argument() -> None:
    config = _config(
        'name: "r" max_batch_size: 4 '
        'input { name: "X" data_type: TYPE_INT32 dims: [ -1 ] reshape { shape: [ 3 ] } } '
        'output { name: "Y" data_type: TYPE_INT32 dims: [ -1 ] }'
    )
    assert _invalid(_request(_tensor("X", "INT32", (1, 5)), model="r"), config) == (
        "input 'X' for model 'r' of shape [1,5] cannot be reshaped to [3]"
    )


def test_no_reshape_field_leaves_shape() -> None:
    config = _config(
        'name: "r" input { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } '
        'output { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] }'
    )
    assert validate(_request(_tensor("X", "INT32", (1,)), model="r"), config).inputs["X"].shape == (
        1,
    )
