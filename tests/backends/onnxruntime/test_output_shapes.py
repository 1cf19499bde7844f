"""Unit tests for backends.onnxruntime.output_shapes: which output shapes are known before a run."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from backends.onnxruntime.output_shapes import OutputShapes


@dataclass
class Arg:
    """What OutputShapes reads of an ``onnxruntime.NodeArg``."""

    name: str
    type: str
    shape: list[int | str | None] | None


FLOAT = "tensor(float)"
INPUTS = [Arg("A", FLOAT, ["batch", "n"]), Arg("B", "tensor(int64)", ["batch", 3])]


def shapes(*outputs: Arg) -> OutputShapes:
    return OutputShapes(INPUTS, outputs)


def inputs(batch: int = 2, n: int = 5) -> dict[str, np.ndarray]:
    return {"A": np.zeros((batch, n), np.float32), "B": np.zeros((batch, 3), np.int64)}


def test_named_dimensions_take_the_size_of_the_input_dimension_of_that_name() -> None:
    known = shapes(Arg("Y", FLOAT, ["batch", "n", 4]), Arg("Z", "tensor(int32)", [7]))
    assert known.resolve(inputs(2, 5), ["Y", "Z"]) == [
        (np.dtype(np.float32), (2, 5, 4)),
        (np.dtype(np.int32), (7,)),
    ]
    assert known.resolve(inputs(9, 1), ["Z", "Y"]) == [
        (np.dtype(np.int32), (7,)),
        (np.dtype(np.float32), (9, 1, 4)),
    ]


def test_a_scalar_output_is_known() -> None:
    assert shapes(Arg("S", FLOAT, [])).resolve(inputs(), ["S"]) == [(np.dtype(np.float32), ())]


def test_outputs_whose_shape_only_the_run_knows() -> None:
    known = shapes(
        Arg("fresh_name", FLOAT, ["batch", "m"]),
        Arg("unknown_dim", FLOAT, ["batch", None]),
        Arg("unknown_rank", FLOAT, None),
        Arg("strings", "tensor(string)", ["batch"]),
        Arg("bf16", "tensor(bfloat16)", ["batch"]),
        Arg("fine", FLOAT, ["batch"]),
    )
    for name in ("fresh_name", "unknown_dim", "unknown_rank", "strings", "bf16"):
        assert known.resolve(inputs(), [name]) is None, name
        assert known.resolve(inputs(), ["fine", name]) is None, name
    assert known.resolve(inputs(), ["not_an_output"]) is None
    assert known.resolve(inputs(), ["fine"]) == [(np.dtype(np.float32), (2,))]


def test_an_input_missing_or_of_lower_rank_leaves_the_shape_unknown() -> None:
    known = shapes(Arg("Y", FLOAT, ["batch", "n"]))
    assert known.resolve({"A": np.zeros(4, np.float32)}, ["Y"]) is None
    assert known.resolve({}, ["Y"]) is None
