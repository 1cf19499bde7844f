"""Output shapes known before a run, from the dimension names an ONNX graph declares.

An output dimension that is a number, or a name that some input dimension bears too, is known
as soon as the inputs are: an identity model's ``[batch, n]`` output is its input's shape. With
every wanted output's shape known, a run can write its outputs into memory it is given
(``ModelInstance.execute_into``) instead of memory they are copied out of afterwards.

A graph may name a dimension like an input's and compute it otherwise; ONNX Runtime then
refuses the run, and the instance runs it again as usual and stops trusting the names
(``OnnxRuntimeInstance.execute_into``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import onnxruntime as ort

from backends.onnxruntime.ort_types import BF16, ORT_DTYPES

#: A dimension: its size, or the input and axis whose size it is.
Dim = int | tuple[str, int]


class OutputShapes:
    """How each output's shape follows from the inputs', where the graph says so."""

    def __init__(self, inputs: Sequence[ort.NodeArg], outputs: Sequence[ort.NodeArg]) -> None:
        sources: dict[str, tuple[str, int]] = {}
        for arg in inputs:
            for axis, dim in enumerate(arg.shape or ()):
                if isinstance(dim, str):
                    sources.setdefault(dim, (arg.name, axis))
        #: output name -> its dtype and dimensions; None when not known before a run
        self._rules: dict[str, tuple[np.dtype, tuple[Dim, ...]] | None] = {}
        for arg in outputs:
            self._rules[arg.name] = _rule(arg, sources)

    def resolve(
        self, inputs: Mapping[str, np.ndarray], names: Sequence[str]
    ) -> list[tuple[np.dtype, tuple[int, ...]]] | None:
        """Dtype and shape of each output in ``names`` for a run on ``inputs``; None when
        one of them is not known before the run."""
        planned = []
        try:  # a missing input or axis fails the lookup: no checks beforehand
            for name in names:
                rule = self._rules[name]
                if rule is None:
                    return None
                dtype, dims = rule
                shape = tuple([
                    dim if isinstance(dim, int) else inputs[dim[0]].shape[dim[1]] for dim in dims
                ])
                planned.append((dtype, shape))
        except (KeyError, IndexError):
            return None
        return planned


def _rule(
    arg: ort.NodeArg, sources: Mapping[str, tuple[str, int]]
) -> tuple[np.dtype, tuple[Dim, ...]] | None:
    dtype = ORT_DTYPES.get(arg.type)
    if dtype is None or dtype == BF16 or arg.shape is None:  # strings, bfloat16, unknown rank
        return None
    dims: list[Dim] = []
    for dim in arg.shape:
        if isinstance(dim, int) and dim >= 0:
            dims.append(dim)
        elif isinstance(dim, str) and dim in sources:
            dims.append(sources[dim])
        else:
            return None
    return dtype, tuple(dims)
