"""The classification extension: an output asked for with a class count comes back as its top k.

Both transports put the count in the output's parameters under ``classification`` (HTTP: a
JSON unsigned integer; gRPC: an ``int64_param``, which ``tritonclient`` sets from
``class_count``); the codecs check it, the data plane turns the computed tensor into its
classification once, for both transports and both process layouts. Results follow Triton 2.51
(triton-features §1.3): a BYTES tensor of ``"<value>:<index>[:<label>]"`` strings, value
descending, shaped ``[batch, min(k, n)]`` for a batching model (``[min(k, n)]`` otherwise), the
value printed as C++ ``std::to_string`` prints it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from server.errors import InvalidArgument
from server.protocol import datatypes
from server.protocol.model_spec import TensorSpec
from server.protocol.types import InferRequest, OutputTensor, RequestedOutput

#: The output parameter that asks for a classification.
PARAMETER = "classification"
#: Datatypes Triton classifies (the others are refused with its text).
SUPPORTED = frozenset(
    {"UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP32", "FP64"}
)
#: Triton refuses to rank more elements than this.
MAX_ELEMENTS = 1_000_000
_BYTES = datatypes.from_name("BYTES")


def parse_count(value: Any, in_shared_memory: bool) -> int:
    """The class count of an output's ``classification`` parameter, checked: a non-negative
    integer, and not with the output in shared memory. Triton answers a wrong value over HTTP
    with 500 and this text; it is the client's mistake, so it is a 400 here."""
    if type(value) is not int or value < 0:
        raise InvalidArgument(
            "Unable to set 'classification': attempt to access JSON non-unsigned-integer as "
            "unsigned-integer"
        )
    if in_shared_memory:
        raise InvalidArgument("Output can't set both 'shared_memory_region' and 'classification'")
    return value


def class_count(output: RequestedOutput) -> int:
    """The class count a (decoded, checked) requested output asks for; 0: the raw tensor."""
    count = output.parameters.get(PARAMETER, 0)
    return count if type(count) is int and count > 0 else 0


def class_counts(request: InferRequest) -> dict[str, int]:
    """Output name -> class count, for the outputs of ``request`` to classify."""
    counts: dict[str, int] = {}
    for output in request.outputs or ():
        if PARAMETER in output.parameters:  # (most ask for none: no call for them)
            count = class_count(output)
            if count:
                counts[output.name] = count
    return counts


def check_datatype(output: RequestedOutput, declared: TensorSpec) -> None:
    """Refuse a classification of an output Triton cannot rank, before the model runs."""
    if class_count(output) and declared.datatype.name not in SUPPORTED:
        raise InvalidArgument(
            "class result not available for output due to unsupported type "
            f"'{declared.datatype.name}'"
        )


def classify(
    output: OutputTensor, count: int, batching: bool, labels: Sequence[bytes] = ()
) -> OutputTensor:
    """``output`` as its top ``count`` classes (``count`` 0: unchanged). A batching model's
    output is ranked per batch entry, every other dimension flattened."""
    if count <= 0:
        return output
    if output.datatype.name not in SUPPORTED:  # (validation refuses it first)
        raise InvalidArgument(
            "class result not available for output due to unsupported type "
            f"'{output.datatype.name}'"
        )
    data = np.asarray(output.data)
    rows = data.reshape(data.shape[0] if batching and data.ndim else 1, -1)
    if rows.shape[1] > MAX_ELEMENTS:
        raise InvalidArgument("classification output tensor too large")
    top = min(count, rows.shape[1])
    classes = np.empty((rows.shape[0], top), dtype=object)
    for row, order in enumerate(descending_order(rows)[:, :top]):
        classes[row] = [class_text(rows[row, index], int(index), labels) for index in order]
    shape = classes.shape if batching else (top,)
    return OutputTensor(output.name, _BYTES, tuple(shape), classes.reshape(shape))


def descending_order(rows: np.ndarray) -> np.ndarray:
    """Per row, the indices by value descending, equal values lower index first (the order
    Triton's sort gave in the run; it does not promise one)."""
    width = rows.shape[1]
    # A stable ascending sort of the reversed row, read backwards: descending, and among
    # equal values the lower original index first. (No negation: it overflows unsigned.)
    ascending: np.ndarray = np.argsort(rows[:, ::-1], axis=1, kind="stable")
    order: np.ndarray = (width - 1 - ascending)[:, ::-1]
    return order


def class_text(value: Any, index: int, labels: Sequence[bytes] = ()) -> bytes:
    """One class: ``<value>:<index>`` and ``:<label>`` when the label file has a (non-empty)
    line ``index``. Floats print as ``%f`` (``std::to_string``), integers bare."""
    number = b"%f" % float(value) if isinstance(value, np.floating) else b"%d" % int(value)
    label = labels[index] if index < len(labels) else b""
    return b"%s:%d:%s" % (number, index, label) if label else b"%s:%d" % (number, index)

