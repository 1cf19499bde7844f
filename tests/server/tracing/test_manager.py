"""Global and per-model trace settings, their clearing, and sampling by rate and count, as
Triton's ``TraceManager`` keeps them; the Triton-mode files they write."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from server.errors import InvalidArgument
from server.tracing.config import TraceConfig
from server.tracing.context import TraceContext
from server.tracing.manager import CLEAR, TraceManager


def _manager(path: Path, **overrides: Any) -> TraceManager:
    values: dict[str, Any] = {"level": ("TIMESTAMPS",), "rate": 1, "file": str(path)}
    values.update(overrides)
    return TraceManager(TraceConfig(**values))


def _settings(level: list[str], rate: str, count: str, frequency: str, file: str) -> dict[
    str, Any
]:
    return {"trace_level": level, "trace_rate": rate, "trace_count": count,
            "log_frequency": frequency, "trace_file": file, "trace_mode": "triton"}


def test_model_settings_follow_the_global_ones_where_not_set(tmp_path: Path) -> None:
    # The sequence of Triton's L0_trace trace_endpoint_test (test_http_clear_settings).
    file = str(tmp_path / "t.json")
    manager = _manager(tmp_path / "t.json")
    manager.update("simple", {"trace_rate": 12, "log_frequency": 34})
    manager.update("", {"trace_rate": 56, "trace_count": 78, "trace_level": []})
    assert manager.settings("simple") == _settings(["OFF"], "12", "78", "34", file)
    manager.update("", {"trace_rate": CLEAR, "trace_count": CLEAR})
    assert manager.settings("") == _settings(["OFF"], "1", "-1", "0", file)
    assert manager.settings("simple") == _settings(["OFF"], "12", "-1", "34", file)
    manager.update("simple", {"trace_rate": CLEAR, "trace_level": CLEAR})
    assert manager.settings("simple") == _settings(["OFF"], "1", "-1", "34", file)
    manager.update("simple", {"log_frequency": CLEAR})  # nothing of its own: the global one
    manager.update("", {"trace_level": ["TIMESTAMPS", "TENSORS"]})
    assert manager.settings("simple") == manager.settings("")
    assert manager.settings("other") == _settings(["TIMESTAMPS", "TENSORS"], "1", "-1", "0", file)


def test_invalid_settings_are_refused_unless_they_turn_tracing_off(tmp_path: Path) -> None:
    manager = TraceManager(TraceConfig())
    assert not manager.active
    with pytest.raises(InvalidArgument) as exc:
        manager.update("m", {"trace_level": ["TIMESTAMPS"]})
    assert exc.value.message == "Attempting to set invalid trace setting :trace file name is not given"
    manager = _manager(tmp_path / "t.json")
    with pytest.raises(InvalidArgument, match="sample rate must be non-zero"):
        manager.update("", {"trace_rate": 0})
    manager.update("", {"trace_rate": 0, "trace_level": []})  # off: accepted
    assert not manager.active


def _context() -> TraceContext:
    return TraceContext("HTTP", 1, 2)


def test_every_rate_th_request_is_traced_count_times_at_most(tmp_path: Path) -> None:
    manager = _manager(tmp_path / "t.json", rate=2, count=2)
    sampled = [manager.start("m", 1, "", _context()) for _ in range(8)]
    assert [t is not None for t in sampled] == [False, True, False, True] + [False] * 4
    assert manager.settings("m")["trace_count"] == "0"
    ids = [t.id for t in sampled if t is not None]
    assert ids == [1, 2]


def test_traces_roll_over_into_indexed_files(tmp_path: Path) -> None:
    manager = _manager(tmp_path / "t.json", log_frequency=2)
    for number in range(5):
        trace = manager.start("m", 3, f"r{number}", _context())
        assert trace is not None
        trace.stamp("REQUEST_START", 10)
        trace.stamp("REQUEST_END", 20)
        trace.finish(30, 40)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["t.json.0", "t.json.1"]
    manager.close()  # the rest goes to the next index
    assert json.loads((tmp_path / "t.json.2").read_text())[2] == {
        "id": 5, "model_name": "m", "model_version": 3, "request_id": "r4",
    }
    first = json.loads((tmp_path / "t.json.0").read_text())
    assert [o.get("timestamps", [{}])[0].get("name") for o in first if o["id"] == 1] == [
        "HTTP_RECV_START", "HTTP_RECV_END", None, "REQUEST_START", "REQUEST_END",
        "HTTP_SEND_START", "HTTP_SEND_END",
    ]


def test_without_log_frequency_traces_go_to_the_file_as_the_server_stops(tmp_path: Path) -> None:
    manager = _manager(tmp_path / "t.json")
    for _ in range(3):
        trace = manager.start("m", 1, "", _context())
        assert trace is not None
        trace.finish(0, 0)
    assert not (tmp_path / "t.json").exists()
    manager.update("", {"trace_rate": 5})  # the replaced setting's traces are written
    manager.close()
    traces = json.loads((tmp_path / "t.json").read_text())
    assert sorted({o["id"] for o in traces}) == [1, 2, 3]
    assert {"id": 1, "model_name": "m", "model_version": 1} in traces
