"""Triton mode's output: each trace as Triton writes it (``src/tracer.cc``), a run of JSON
objects sharing the trace's ``id`` — the transport's receive timestamps, the model record
(``model_name``, ``model_version``, ``request_id`` if any, ``parent_id`` for an ensemble's
step), one object per activity timestamp, ``TENSORS`` records, the send timestamps, then the
traces of its ensemble steps — and the files they go to. At the TENSORS level alone there are
no timestamps.

With ``log_frequency`` 0 the traces are kept until the setting is replaced or the server
stops, then appended to ``trace_file``, one JSON array closed when the server stops; with
``log_frequency`` N every N traces go to ``<trace_file>.<index>``, an array each, as does the
rest when the setting is replaced or the server stops. Unlike Triton's, the text is valid
JSON whatever the names hold (Triton writes them unescaped).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import IO

import numpy as np
import orjson

from server.tracing.record import Trace, TracedTensor

log = logging.getLogger("server.trace")


def render(trace: Trace, send_start: int, send_end: int) -> str:
    """The trace's JSON objects, then its ensemble steps' (each a trace with a
    ``parent_id``), comma-separated (one element run of the file's array)."""
    parts = [_render(trace, send_start, send_end)]
    pending = list(trace.children)
    while pending:
        child = pending.pop(0)
        parts.append(_render(child, 0, 0))
        pending += child.children
    return ",".join(parts)


def _render(trace: Trace, send_start: int, send_end: int) -> str:
    head = f'{{"id":{trace.id},'
    record: dict[str, object] = {
        "id": trace.id, "model_name": trace.model_name, "model_version": trace.model_version,
    }
    if trace.request_id:
        record["request_id"] = trace.request_id
    if trace.parent_id:
        record["parent_id"] = trace.parent_id
    before, after = trace.front_end_stamps(send_start, send_end)
    if trace.parent_id:  # a step: the transport's times are its parent's
        before, after = [], []
    timed = "TIMESTAMPS" in trace.level
    if not timed:  # TENSORS alone (the record is kept, Triton's file would lack it)
        before, after = [], []
    parts = [_stamp(head, name, ns) for name, ns in before]
    parts.append(orjson.dumps(record).decode())
    # Tensors go where Triton reports them: inputs as the request is queued, outputs as
    # the model hands them back.
    for name, ns in trace.timestamps:
        if timed:
            parts.append(_stamp(head, name, ns))
        if name == "QUEUE_START":
            parts += [_tensor(head, t) for t in trace.tensors if t.activity.endswith("INPUT")]
        elif name == "COMPUTE_OUTPUT_START":
            parts += [_tensor(head, t) for t in trace.tensors if t.activity.endswith("OUTPUT")]
    parts += [_stamp(head, name, ns) for name, ns in after]
    return ",".join(parts)


def _stamp(head: str, name: str, ns: int) -> str:
    return f'{head}"timestamps":[{{"name":"{name}","ns":{ns}}}]}}'


def _tensor(head: str, tensor: TracedTensor) -> str:
    body = {
        "name": tensor.name,
        "data": _values(tensor.data, tensor.datatype),
        "shape": ",".join(str(d) for d in tensor.data.shape),
        "dtype": tensor.datatype,
    }
    activity = orjson.dumps(tensor.activity).decode()
    return f'{head}"activity":{activity},"tensor":{orjson.dumps(body).decode()}}}'


def _values(data: np.ndarray, datatype: str) -> str:
    """The elements as Triton prints them: numbers comma-separated (floats as C++ streams
    them, 6 significant digits), BOOL as 1/0, BYTES quoted; FP16 and BF16 not at all."""
    if datatype in ("FP16", "BF16"):
        return ""
    flat = data.reshape(-1)
    if datatype == "BYTES":
        return ",".join(
            '"' + (v if isinstance(v, str) else bytes(v).decode("utf-8", "replace")) + '"'
            for v in flat.tolist()
        )
    if datatype in ("FP32", "FP64"):
        return ",".join(f"{v:g}" for v in flat.tolist())
    return ",".join(str(int(v)) for v in flat.tolist())


class TraceFile:
    """``trace_file`` and its indexed siblings."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._index = 0
        self._handle: IO[str] | None = None

    def save(self, traces: Sequence[str], indexed: bool) -> None:
        """Write ``traces`` (rendered): to the next ``<path>.<index>`` as an array of its
        own, or appended to ``path``'s array."""
        try:
            if indexed:
                name = f"{self.path}.{self._index}"
                self._index += 1
                # Whole or not at all, for whoever reads the files as they come.
                folder, base = os.path.split(name)
                partial = os.path.join(folder, f".{base}.partial")
                with open(partial, "w", encoding="utf-8") as out:
                    out.write("[" + ",".join(traces) + "]")
                os.replace(partial, name)
                return
            if self._handle is None:
                self._handle = open(self.path, "w", encoding="utf-8")  # noqa: SIM115
                self._handle.write("[")
            else:
                self._handle.write(",")
            self._handle.write(",".join(traces))
            self._handle.flush()
        except OSError as exc:
            log.error("failed creating trace file: %s", exc)

    def close(self) -> None:
        """Close ``path``'s array (the server stops)."""
        if self._handle is not None:
            try:
                self._handle.write("]")
                self._handle.close()
            except OSError as exc:
                log.error("failed writing trace file: %s", exc)
            self._handle = None
