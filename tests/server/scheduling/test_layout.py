"""BatchLayout: plain row batching, and Triton's ragged inputs, batch inputs and batch outputs,
checked on Triton's documented example (requests of [1, 3], [1, 4] and [1, 5] elements)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from google.protobuf import text_format

from server.errors import InternalError, ModelLoadError
from server.generated import model_config_pb2 as mc
from server.scheduling.job import Job
from server.scheduling.layout import BatchLayout, validate_config

RAGGED_CONFIG = """
name: "ragged"
max_batch_size: 16
input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true },
        { name: "SCALE" data_type: TYPE_FP32 dims: [ 2 ] } ]
output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ -1 ] },
         { name: "PER_ROW" data_type: TYPE_FP32 dims: [ 2 ] } ]
batch_input [
  { kind: BATCH_ELEMENT_COUNT target_name: "COUNT" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT target_name: [ "ENDS", "ENDS_COPY" ]
    data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO target_name: "OFFSETS" data_type: TYPE_INT64
    source_input: "INPUT" },
  { kind: BATCH_MAX_ELEMENT_COUNT_AS_SHAPE target_name: "MAX" data_type: TYPE_FP32
    source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE target_name: "SHAPES" data_type: TYPE_INT32 source_input: "INPUT" },
  { kind: BATCH_ITEM_SHAPE_FLATTEN target_name: "SHAPES_FLAT" data_type: TYPE_INT32
    source_input: "INPUT" }
]
batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "OUTPUT"
                 source_input: "INPUT" } ]
"""


def config(text: str = RAGGED_CONFIG) -> mc.ModelConfig:
    return text_format.Parse(text, mc.ModelConfig())


def ragged_job(tag: int, rows: int, length: int) -> Job:
    values = tag * 100 + np.arange(rows * length, dtype=np.float32)
    scale = np.full((rows, 2), tag, dtype=np.float32)
    return Job(
        {"INPUT": values.reshape(rows, length), "SCALE": scale},
        ["OUTPUT", "PER_ROW"],
        rows=rows,
    )


def test_triton_example_batch_inputs() -> None:
    """Triton's ragged batching doc: [1, 3], [1, 4], [1, 5] become one 12-element INPUT and
    the batch inputs describe where each request's elements are."""
    layout = BatchLayout.from_config(config())
    jobs = [ragged_job(1, 1, 3), ragged_job(2, 1, 4), ragged_job(3, 1, 5)]
    assert len({layout.shape_key(job) for job in jobs}) == 1, "ragged dims must not split"
    inputs = layout.gather(jobs, {})
    np.testing.assert_array_equal(
        inputs["INPUT"], np.concatenate([job.inputs["INPUT"].ravel() for job in jobs])
    )
    assert inputs["INPUT"].shape == (12,)
    assert inputs["SCALE"].shape == (3, 2), "a regular input is concatenated by rows"
    np.testing.assert_array_equal(inputs["COUNT"], np.array([3, 4, 5], dtype=np.int32))
    assert inputs["COUNT"].dtype == np.int32
    np.testing.assert_array_equal(inputs["ENDS"], [3, 7, 12])
    np.testing.assert_array_equal(inputs["ENDS_COPY"], [3, 7, 12])
    np.testing.assert_array_equal(inputs["OFFSETS"], [0, 3, 7, 12])
    assert inputs["OFFSETS"].dtype == np.int64
    assert inputs["MAX"].shape == (5,) and inputs["MAX"].dtype == np.float32
    np.testing.assert_array_equal(inputs["SHAPES"], [[3], [4], [5]])
    np.testing.assert_array_equal(inputs["SHAPES_FLAT"], [3, 4, 5])


def test_item_shapes_are_per_row_and_counts_per_request() -> None:
    """A 2-row request counts its elements once but has two batch items."""
    layout = BatchLayout.from_config(config())
    inputs = layout.gather([ragged_job(1, 2, 3), ragged_job(2, 1, 2)], {})
    np.testing.assert_array_equal(inputs["COUNT"], [6, 2])
    np.testing.assert_array_equal(inputs["SHAPES"], [[3], [3], [2]])
    np.testing.assert_array_equal(inputs["SHAPES_FLAT"], [3, 3, 2])
    assert inputs["INPUT"].shape == (8,)


def test_a_single_ragged_request_is_flattened_without_a_copy() -> None:
    layout = BatchLayout.from_config(config())
    job = ragged_job(1, 2, 3)
    inputs = layout.gather([job], {})
    assert inputs["INPUT"].shape == (6,)
    assert np.shares_memory(inputs["INPUT"], job.inputs["INPUT"])
    assert inputs["SCALE"] is job.inputs["SCALE"]
    np.testing.assert_array_equal(inputs["ENDS"], [6])


def test_scatter_by_source_shape_and_by_rows() -> None:
    layout = BatchLayout.from_config(config())
    jobs = [ragged_job(1, 1, 3), ragged_job(2, 2, 4), ragged_job(3, 1, 1)]
    inputs = layout.gather(jobs, {})
    outputs = {"OUTPUT": inputs["INPUT"] * 2, "PER_ROW": inputs["SCALE"] + 1}
    answers = layout.scatter("ragged", jobs, outputs)
    for job, answer in zip(jobs, answers):
        assert set(answer) == {"OUTPUT", "PER_ROW"}
        np.testing.assert_array_equal(answer["OUTPUT"], job.inputs["INPUT"] * 2)
        assert answer["OUTPUT"].shape == job.inputs["INPUT"].shape
        np.testing.assert_array_equal(answer["PER_ROW"], job.inputs["SCALE"] + 1)


def test_scatter_refuses_outputs_that_do_not_add_up() -> None:
    layout = BatchLayout.from_config(config())
    jobs = [ragged_job(1, 1, 3), ragged_job(2, 1, 4)]
    inputs = layout.gather(jobs, {})
    with pytest.raises(InternalError, match="'OUTPUT' with 6 elements where .* call for 7"):
        layout.scatter("ragged", jobs, {"OUTPUT": inputs["INPUT"][:6], "PER_ROW": inputs["SCALE"]})
    with pytest.raises(InternalError, match="'PER_ROW' with 1 rows for a batch of 2"):
        layout.scatter("ragged", jobs, {"OUTPUT": inputs["INPUT"], "PER_ROW": inputs["SCALE"][:1]})


def test_requests_batch_only_with_their_own_dtypes_and_input_names() -> None:
    """Types of one size never share a batch (numpy names BF16 a two-byte void, and every
    one-byte float8 type alike); the order a request lists its inputs in does not matter."""
    layout = BatchLayout()

    def key(dtype: np.dtype, names: tuple[str, ...] = ("x",)) -> object:
        return layout.shape_key(Job({n: np.zeros((1, 3), dtype) for n in names}, ["y"]))

    bf16 = np.dtype(ml_dtypes.bfloat16)
    assert key(bf16) == key(np.dtype(ml_dtypes.bfloat16))
    keys = [key(bf16), key(np.dtype(np.float16)), key(np.dtype(np.int16)), key(np.dtype("V2"))]
    assert len(set(keys)) == 4
    assert key(np.dtype(ml_dtypes.float8_e4m3fn)) != key(np.dtype(ml_dtypes.float8_e4m3fnuz))
    assert key(np.dtype(np.int32), ("a", "b")) == key(np.dtype(np.int32), ("b", "a"))
    assert key(np.dtype(np.int32), ("a",)) != key(np.dtype(np.int32), ("a", "b"))


def test_plain_layout_passes_a_single_request_through_and_reuses_buffers() -> None:
    layout = BatchLayout()
    assert layout.plain
    a = Job({"x": np.ones((2, 3), np.float32)}, ["y"], rows=2)
    b = Job({"x": np.zeros((1, 3), np.float32)}, ["y"], rows=1)
    assert layout.gather([a], {})["x"] is a.inputs["x"]
    assert layout.shape_key(a) == layout.shape_key(b)
    wide = Job({"x": np.ones((1, 4), np.float32)}, ["y"], rows=1)
    assert layout.shape_key(a) != layout.shape_key(wide), "plain inputs must share their dims"
    buffers: dict[str, np.ndarray] = {}
    first = layout.gather([a, b], buffers)["x"]
    second = layout.gather([b, a], buffers)["x"]
    assert np.shares_memory(first, second), "the gather buffer is reused"
    np.testing.assert_array_equal(second, np.concatenate([b.inputs["x"], a.inputs["x"]]))
    bigger = layout.gather([a, a, b], buffers)["x"]
    assert bigger.shape == (5, 3)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ("max_batch_size: 0", "need max_batch_size > 0"),
        (
            (
                'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "C" data_type: TYPE_INT32 '
                'source_input: "NOPE" } ]'
            ),
            "expects 1 source input",
        ),
        (
            (
                'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "X" data_type: TYPE_INT32 '
                'source_input: "X" } ]'
            ),
            "target 'X' .* is already an input",
        ),
        (
            (
                'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "C" data_type: TYPE_UINT8 '
                'source_input: "X" } ]'
            ),
            "must have data_type TYPE_INT32, TYPE_INT64 or TYPE_FP32",
        ),
        (
            'batch_input [ { kind: BATCH_ELEMENT_COUNT data_type: TYPE_INT32 source_input: "X" } ]',
            "has no target_name",
        ),
        (
            (
                'batch_output [ { kind: BATCH_SCATTER_WITH_INPUT_SHAPE target_name: "Z" '
                'source_input: "X" } ]'
            ),
            "target 'Z' .* is not a model output",
        ),
    ],
)
def test_validate_refuses_what_it_cannot_honour(change: str, message: str) -> None:
    base = (
        'name: "m" max_batch_size: 4 '
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true } ] '
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ] '
    )
    text = base.replace("max_batch_size: 4", change) if "max_batch_size" in change else base + change
    with pytest.raises(ModelLoadError, match=message):
        validate_config(config(text))


def test_validate_accepts_the_documented_config() -> None:
    validate_config(config())


def test_bytes_inputs_get_a_fresh_buffer_every_batch() -> None:
    """A reused object buffer would keep earlier batches' strings alive in its unused rows."""
    layout = BatchLayout()
    big = [Job({"s": np.array([[b"x" * 10]], dtype=object)}, ["y"]) for _ in range(4)]
    small = [Job({"s": np.array([[b"y"]], dtype=object)}, ["y"]) for _ in range(2)]
    buffers: dict[str, np.ndarray] = {}
    first = layout.gather(big, buffers)["s"]
    second = layout.gather(small, buffers)["s"]
    assert not np.shares_memory(first, second)
    assert second.shape == (2, 1) and list(second.ravel()) == [b"y", b"y"]
    assert "s" not in buffers


def test_an_optional_input_cannot_feed_a_batch_input() -> None:
    text = (
        'name: "m" max_batch_size: 4 '
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ -1 ] optional: true } ] '
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ -1 ] } ] '
        'batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: "C" data_type: TYPE_INT32 '
        'source_input: "X" } ]'
    )
    with pytest.raises(ModelLoadError, match="optional input 'X'"):
        validate_config(config(text))
