"""Unit tests for server.protocol.classification: ranking, Triton's number formatting, shapes,
labels, and the refusals (triton-features §1.3, the values seen on Triton 2.51)."""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np
import pytest

from server.errors import InvalidArgument
from server.protocol import classification, datatypes
from server.protocol.classification import class_counts, class_text, classify, parse_count
from server.protocol.model_spec import ModelSpec, TensorSpec
from server.protocol.types import InferRequest, InputTensor, OutputTensor, RequestedOutput
from server.protocol.validation import validate

DT = datatypes.BY_NAME
FRUIT = (b"apple", b"pickle", b"pear", b"plum")


def _output(data: np.ndarray, datatype: str) -> OutputTensor:
    return OutputTensor("OUT", DT[datatype], tuple(data.shape), data)


def _strings(output: OutputTensor) -> list[str]:
    return [item.decode() for item in output.data.reshape(-1)]


# --- what Triton 2.51 answered ----------------------------------------------------------------


def test_a_batch_of_two_floats_with_labels() -> None:
    data = np.array([[1.1, 3.3, 0.5, 2.4], [10, 5, 1, 4]], np.float32)
    result = classify(_output(data, "FP32"), 2, batching=True, labels=FRUIT)
    assert result.datatype is DT["BYTES"]
    assert result.shape == (2, 2) == result.data.shape
    assert _strings(result) == [
        "3.300000:1:pickle", "2.400000:3:plum", "10.000000:0:apple", "5.000000:1:pickle",
    ]


def test_integers_print_bare_and_ties_keep_the_lower_index_first() -> None:
    data = np.array([[7, 7, -3, 9]], np.int32)
    result = classify(_output(data, "INT32"), 4, batching=True, labels=FRUIT)
    assert _strings(result) == ["9:3:plum", "7:0:apple", "7:1:pickle", "-3:2:pear"]


def test_a_count_above_the_element_count_gives_every_element() -> None:
    data = np.array([[0.1, 0.4, 0.2, 0.3]], np.float32)
    result = classify(_output(data, "FP32"), 9, batching=True)
    assert result.shape == (1, 4)
    assert _strings(result) == ["0.400000:1", "0.300000:3", "0.200000:2", "0.100000:0"]


def test_a_non_batching_model_gets_a_flat_result() -> None:
    data = np.array([0.5, 0.25, 0.75, 1.0], np.float64)
    result = classify(_output(data, "FP64"), 3, batching=False)
    assert result.shape == (3,) == result.data.shape
    assert _strings(result) == ["1.000000:3", "0.750000:2", "0.500000:0"]


def test_every_non_batch_dimension_is_ranked_as_one_vector() -> None:
    data = np.array([[[1, 8], [3, 4]], [[9, 0], [2, 5]]], np.int64)  # batch 2 of 2x2
    result = classify(_output(data, "INT64"), 2, batching=True)
    assert result.shape == (2, 2)
    assert _strings(result) == ["8:1", "4:3", "9:0", "5:3"]
    flat = classify(_output(data, "INT64"), 3, batching=False)  # no batch: all 8 at once
    assert _strings(flat) == ["9:4", "8:1", "5:7"]


def test_a_count_of_zero_leaves_the_tensor_as_it_is() -> None:
    output = _output(np.array([[1.0, 2.0]], np.float32), "FP32")
    assert classify(output, 0, batching=True, labels=FRUIT) is output


# --- formatting -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (np.float32(0.999999), "0.999999:3"),
        (np.float32(0.9999999), "1.000000:3"),  # %f rounds to six decimals
        (np.float32(1e-7), "0.000000:3"),
        (np.float32(-2.5), "-2.500000:3"),
        (np.float64(123456789.125), "123456789.125000:3"),
        (np.float32(3.4e38), "339999995214436424907732413799364296704.000000:3"),
        (np.float32("inf"), "inf:3"),
        (np.float32("-inf"), "-inf:3"),
        (np.uint64(2**64 - 1), "18446744073709551615:3"),
        (np.int8(-128), "-128:3"),
        (np.uint8(255), "255:3"),
    ],
)
def test_values_print_as_cpp_to_string(value: Any, expected: str) -> None:
    assert class_text(value, 3).decode() == expected


def test_labels_past_the_end_or_empty_give_no_third_part() -> None:
    labels = (b"zero", b"", b"two")
    assert class_text(np.int32(5), 0, labels) == b"5:0:zero"
    assert class_text(np.int32(5), 1, labels) == b"5:1"
    assert class_text(np.int32(5), 3, labels) == b"5:3"


def test_unsigned_values_rank_without_overflow() -> None:
    data = np.array([0, 2**64 - 1, 5, 5], np.uint64)
    result = classify(_output(data, "UINT64"), 4, batching=False)
    assert _strings(result) == ["18446744073709551615:1", "5:2", "5:3", "0:0"]


@pytest.mark.parametrize("datatype", sorted(classification.SUPPORTED))
def test_every_supported_datatype_is_ranked(datatype: str) -> None:
    data = np.array([[1, 3, 2]], DT[datatype].dtype)
    result = classify(_output(data, datatype), 2, batching=True)
    assert [s.split(":")[1] for s in _strings(result)] == ["1", "2"]


def test_an_empty_batch_entry_gives_no_classes() -> None:
    result = classify(_output(np.zeros((2, 0), np.float32), "FP32"), 3, batching=True)
    assert result.shape == (2, 0)


# --- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("datatype", "data"),
    [
        ("FP16", np.ones((1, 2), np.float16)),
        ("BF16", np.ones((1, 2), ml_dtypes.bfloat16)),
        ("BOOL", np.ones((1, 2), np.bool_)),
        ("BYTES", np.array([[b"a", b"b"]], dtype=object)),
    ],
)
def test_unsupported_datatypes_are_refused_with_tritons_text(
    datatype: str, data: np.ndarray
) -> None:
    message = f"class result not available for output due to unsupported type '{datatype}'"
    with pytest.raises(InvalidArgument, match=f"^{message}$"):
        classify(_output(data, datatype), 1, batching=True)
    spec = TensorSpec("OUT", DT[datatype], (2,), None)
    with pytest.raises(InvalidArgument, match=f"^{message}$") as err:
        classification.check_datatype(RequestedOutput("OUT", {"classification": 1}), spec)
    assert err.value.http_status == 400
    # asking for the raw tensor of such an output is fine
    classification.check_datatype(RequestedOutput("OUT", {"classification": 0}), spec)


def test_too_many_elements_to_rank_are_refused() -> None:
    data = np.zeros((1, classification.MAX_ELEMENTS + 1), np.float32)
    with pytest.raises(InvalidArgument, match="^classification output tensor too large$"):
        classify(_output(data, "FP32"), 1, batching=True)


@pytest.mark.parametrize("value", [-1, "2", 1.0, True, None])
def test_parse_count_refuses_what_is_not_an_unsigned_integer(value: Any) -> None:
    with pytest.raises(InvalidArgument) as err:
        parse_count(value, in_shared_memory=False)
    assert err.value.http_status == 400
    assert "non-unsigned-integer" in err.value.message


def test_parse_count_refuses_an_output_in_shared_memory() -> None:
    assert parse_count(3, in_shared_memory=False) == 3
    with pytest.raises(InvalidArgument, match="can't set both 'shared_memory_region' and"):
        parse_count(3, in_shared_memory=True)


def test_class_counts_name_only_the_outputs_to_classify() -> None:
    request = InferRequest(
        "m", "", [],
        [
            RequestedOutput("A", {"classification": 2}),
            RequestedOutput("B", {"classification": 0}),
            RequestedOutput("C", {"binary_data": True}),
        ],
    )
    assert class_counts(request) == {"A": 2}
    assert class_counts(InferRequest("m", "", [], None)) == {}


def test_validation_refuses_an_unsupported_classification_before_the_model_runs() -> None:
    spec = ModelSpec(
        "m", 4,
        inputs={"IN": TensorSpec("IN", DT["FP32"], (2,), None)},
        outputs={
            "HALF": TensorSpec("HALF", DT["FP16"], (2,), None),
            "FULL": TensorSpec("FULL", DT["FP32"], (2,), None),
        },
    )
    inputs = [InputTensor("IN", DT["FP32"], (1, 2), np.ones((1, 2), np.float32))]

    def request(name: str) -> InferRequest:
        return InferRequest("m", "", inputs, [RequestedOutput(name, {"classification": 1})])

    assert validate(request("FULL"), spec).output_names == ["FULL"]
    with pytest.raises(InvalidArgument, match="unsupported type 'FP16'"):
        validate(request("HALF"), spec)
