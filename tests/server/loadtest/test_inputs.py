"""Inputs from model metadata (every datatype, variable dims with --shape, batches) and from
JSON / .npz files; what the server would refuse is refused before any load is sent."""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from server.loadtest.errors import BenchError, UsageError
from server.loadtest.inputs import (
    ModelInfo,
    TensorSpec,
    generate_inputs,
    inputs_from_data,
    parse_shape_option,
    read_data_file,
)


def _model(*inputs: TensorSpec, max_batch_size: int = 0) -> ModelInfo:
    return ModelInfo("m", "", inputs, (TensorSpec("OUT", "FP32", (-1,)),), max_batch_size)


SIMPLE = _model(
    TensorSpec("INPUT0", "INT32", (-1, 16)),
    TensorSpec("INPUT1", "INT32", (-1, 16)),
    max_batch_size=8,
)


def test_parse_shape_option() -> None:
    assert parse_shape_option("INPUT0:16") == ("INPUT0", (16,))
    assert parse_shape_option("in:put:3,4") == ("in:put", (3, 4))
    for bad in ("INPUT0", "INPUT0:", ":3", "INPUT0:3,x", "INPUT0:0", "INPUT0:-1"):
        with pytest.raises(UsageError, match="invalid --shape"):
            parse_shape_option(bad)


@pytest.mark.parametrize(
    ("datatype", "dtype"),
    [
        ("BOOL", np.bool_),
        ("UINT8", np.uint8),
        ("INT8", np.int8),
        ("UINT64", np.uint64),
        ("INT64", np.int64),
        ("FP16", np.float16),
        ("FP32", np.float32),
        ("FP64", np.float64),
        ("BF16", ml_dtypes.bfloat16),
    ],
)
def test_random_values_have_the_datatype_and_a_safe_range(datatype: str, dtype: type) -> None:
    model = _model(TensorSpec("X", datatype, (4, 8)))
    (tensor,) = generate_inputs(model, "random", 1, {}).tensors
    assert tensor.datatype.name == datatype
    assert tensor.array.dtype == np.dtype(dtype)
    assert tensor.array.shape == (4, 8)
    values = tensor.array.astype(np.float64)
    assert values.min() >= 0 and values.max() < 64
    assert len(np.unique(values)) > 1  # random, not constant


def test_random_bytes_are_short_printable_strings() -> None:
    model = _model(TensorSpec("TEXT", "BYTES", (-1, -1)), max_batch_size=4)
    inputs = generate_inputs(model, "random", 3, {"TEXT": (5,)})
    (tensor,) = inputs.tensors
    assert inputs.rows == 3
    assert tensor.array.shape == (3, 5) and tensor.array.dtype == object
    for item in tensor.array.reshape(-1):
        assert isinstance(item, bytes) and 1 <= len(item) <= 16 and item.isalnum()


def test_zero_values() -> None:
    model = _model(TensorSpec("A", "FP32", (2,)), TensorSpec("B", "BYTES", (3,)))
    a, b = generate_inputs(model, "zero", 1, {}).tensors
    assert a.array.tolist() == [0.0, 0.0]
    assert b.array.tolist() == [b"", b"", b""]


def test_batching_model_gets_the_batch_dimension() -> None:
    inputs = generate_inputs(SIMPLE, "random", 4, {})
    assert inputs.rows == 4
    assert [t.array.shape for t in inputs.tensors] == [(4, 16), (4, 16)]
    assert inputs.tensors[0].array.dtype == np.int32


def test_generation_is_reproducible() -> None:
    first = generate_inputs(SIMPLE, "random", 2, {}).tensors[0].array
    again = generate_inputs(SIMPLE, "random", 2, {}).tensors[0].array
    assert np.array_equal(first, again)


def test_variable_dims_need_shape() -> None:
    model = _model(TensorSpec("INPUT0", "FP32", (-1, -1)), max_batch_size=4)
    with pytest.raises(UsageError, match=r"variable dims \[-1\].*--shape INPUT0:16"):
        generate_inputs(model, "random", 1, {})
    (tensor,) = generate_inputs(model, "random", 2, {"INPUT0": (128,)}).tensors
    assert tensor.array.shape == (2, 128)


def test_shape_must_fit_the_declared_dims() -> None:
    model = _model(TensorSpec("X", "FP32", (-1, 3, -1)), max_batch_size=2)
    assert generate_inputs(model, "zero", 1, {"X": (3, 7)}).tensors[0].array.shape == (1, 3, 7)
    with pytest.raises(UsageError, match="does not fit the dims"):
        generate_inputs(model, "zero", 1, {"X": (4, 7)})
    with pytest.raises(UsageError, match="does not fit the dims"):
        generate_inputs(model, "zero", 1, {"X": (1, 3, 7)})  # the batch dim is not given
    with pytest.raises(UsageError, match="not an input of m"):
        generate_inputs(model, "zero", 1, {"Y": (3, 7)})


def test_batch_size_limits() -> None:
    with pytest.raises(UsageError, match="over model m's max_batch_size 8"):
        generate_inputs(SIMPLE, "random", 9, {})
    unbatched = _model(TensorSpec("X", "FP32", (2,)))
    with pytest.raises(UsageError, match="does not batch"):
        generate_inputs(unbatched, "random", 2, {})


def test_unknown_datatype_is_refused() -> None:
    with pytest.raises(BenchError, match="not a V2 datatype"):
        generate_inputs(_model(TensorSpec("X", "FLOAT", (2,))), "zero", 1, {})


# --- files ------------------------------------------------------------------------------------


def _write(tmp_path: Path, document: object) -> Path:
    path = tmp_path / "data.json"
    path.write_text(json.dumps(document))
    return path


def test_json_simple_dict_rows_are_repeated_for_the_batch(tmp_path: Path) -> None:
    path = _write(tmp_path, {"INPUT0": list(range(16)), "INPUT1": [1] * 16})
    inputs = inputs_from_data(SIMPLE, read_data_file(path), str(path), 3, {})
    assert inputs.rows == 3
    first, second = inputs.tensors
    assert first.array.shape == (3, 16) and first.array.dtype == np.int32
    assert first.array[2].tolist() == list(range(16))
    assert second.array.tolist() == [[1] * 16] * 3


def test_json_with_the_batch_dimension_sets_the_rows(tmp_path: Path) -> None:
    path = _write(tmp_path, {"INPUT0": [[0] * 16, [1] * 16], "INPUT1": [[2] * 16, [3] * 16]})
    inputs = inputs_from_data(SIMPLE, read_data_file(path), "f", None, {})
    assert inputs.rows == 2
    assert inputs.tensors[1].array[:, 0].tolist() == [2, 3]
    with pytest.raises(UsageError, match="2 rows per input but --batch-size is 4"):
        inputs_from_data(SIMPLE, read_data_file(path), "f", 4, {})


def test_perf_analyzer_form_content_and_shape(tmp_path: Path) -> None:
    model = _model(TensorSpec("IMG", "FP16", (-1, 2)), TensorSpec("TXT", "BYTES", (1,)))
    path = _write(
        tmp_path,
        {
            "data": [
                {
                    "IMG": {"content": [0.5, 1, 2, 3, 4, 5], "shape": [3, 2]},
                    "TXT": ["héllo"],
                },
                {"IMG": {"content": [9] * 6, "shape": [3, 2]}, "TXT": ["unused"]},
            ]
        },
    )
    img, txt = inputs_from_data(model, read_data_file(path), "f", None, {}).tensors
    assert img.array.dtype == np.float16 and img.array.shape == (3, 2)
    assert img.array[0].tolist() == [0.5, 1.0]
    assert txt.array.tolist() == ["héllo".encode()]


def test_flat_json_is_shaped_by_the_declared_dims(tmp_path: Path) -> None:
    model = _model(TensorSpec("X", "INT64", (-1, 2, -1)), max_batch_size=4)
    data = {"X": list(range(12))}
    one_row = inputs_from_data(model, data, "f", None, {"X": (2, 6)})
    assert one_row.rows == 1 and one_row.tensors[0].array.shape == (1, 2, 6)
    two_rows = inputs_from_data(model, data, "f", None, {"X": (2, 3)})
    assert two_rows.rows == 2 and two_rows.tensors[0].array.shape == (2, 2, 3)
    with pytest.raises(BenchError, match="12 values"):
        inputs_from_data(model, data, "f", None, {"X": (2, 5)})


def test_data_must_name_exactly_the_inputs(tmp_path: Path) -> None:
    with pytest.raises(BenchError, match="missing INPUT1; unknown EXTRA"):
        inputs_from_data(SIMPLE, {"INPUT0": [0] * 16, "EXTRA": [1]}, "f", None, {})


def test_data_of_the_wrong_shape_or_type_is_refused() -> None:
    with pytest.raises(BenchError, match=r"shape \[3, 15\]"):
        inputs_from_data(
            SIMPLE, {"INPUT0": [[0] * 15] * 3, "INPUT1": [[0] * 15] * 3}, "f", None, {}
        )
    with pytest.raises(BenchError, match="cannot be INT32"):
        inputs_from_data(SIMPLE, {"INPUT0": ["a"] * 16, "INPUT1": [0] * 16}, "f", None, {})


def test_npz(tmp_path: Path) -> None:
    path = tmp_path / "data.npz"
    np.savez(path, INPUT0=np.arange(32, dtype=np.int64).reshape(2, 16), INPUT1=np.ones(16))
    inputs = inputs_from_data(SIMPLE, read_data_file(path), str(path), None, {})
    assert inputs.rows == 2
    first, second = inputs.tensors
    assert first.array.dtype == np.int32 and first.array[1, 0] == 16
    assert second.array.shape == (2, 16) and second.array.dtype == np.int32


def test_npz_strings_become_bytes(tmp_path: Path) -> None:
    path = tmp_path / "text.npz"
    np.savez(path, TXT=np.array(["ab", "c"]))
    model = _model(TensorSpec("TXT", "BYTES", (2,)))
    (tensor,) = inputs_from_data(model, read_data_file(path), "f", None, {}).tensors
    assert tensor.array.tolist() == [b"ab", b"c"]


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="no such file"):
        read_data_file(tmp_path / "absent.json")
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(BenchError, match="cannot read .* as JSON"):
        read_data_file(broken)
    listed = _write(tmp_path, [1, 2])
    with pytest.raises(BenchError, match="expected a JSON object"):
        read_data_file(listed)
