"""The trace settings, global and per model, and the sampling of requests, as Triton's
``TraceManager`` (``src/tracer.cc``) keeps them.

The global setting starts as the command line's; a model's setting names only what was set
for it and takes the rest from the global one, also after later global changes; clearing a
setting (a null or empty value) makes it follow the global one again (for the global one:
the command line's), and a model left with nothing of its own follows the global setting
entirely. Each change replaces the setting and its counters: every ``trace_rate``-th request
is traced, ``trace_count`` more at most (-1: no limit; the answers show what is left). A
request carrying a valid ``traceparent`` is always traced in OpenTelemetry mode, unless
tracing is off. ``active`` is false while every setting is off: the data plane's one check.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from server.errors import InvalidArgument
from server.tracing import triton_file
from server.tracing.config import LEVELS, TraceConfig
from server.tracing.context import TraceContext, parent_ids
from server.tracing.otel import OtelExporter
from server.tracing.record import Trace

#: What a trace setting change holds for a setting it clears.
CLEAR = None
KEYS = ("trace_level", "trace_rate", "trace_count", "log_frequency")


@dataclass
class _Setting:
    level: frozenset[str]
    rate: int
    count: int
    log_frequency: int
    specified: frozenset[str]
    mode: str
    file: triton_file.TraceFile
    exporter: OtelExporter | None
    sample_count: int = 0
    created: int = 0
    collected: int = 0
    stream: list[str] = field(default_factory=list)
    retired: bool = False

    def reason(self) -> str | None:
        """Why it traces nothing (Triton's texts); "" when only the count is spent."""
        if not self.level:
            return "tracing is disabled"
        if self.rate == 0:
            return "sample rate must be non-zero"
        if self.mode == "triton" and not self.file.path:
            return "trace file name is not given"
        return "" if self.count == 0 else None

    def sample(self, force: bool) -> bool:
        hit = False
        if self.rate != 0:
            if self.reason() is not None and not force:
                return False
            self.sample_count += 1
            hit = self.sample_count % self.rate == 0
            if hit and self.count > 0:
                self.count -= 1
                self.created += 1
            elif hit and self.count == 0:
                hit = False
        return hit or force

    def write(self, trace: Trace, send_start: int, send_end: int) -> None:
        if self.exporter is not None:
            self.exporter.export(trace, send_start, send_end)
            return
        self.stream.append(triton_file.render(trace, send_start, send_end))
        self.collected += 1
        # Triton compares with every request counted (so only rate 1 ever meets it); the
        # traces made is what it means.
        spent = self.count == 0 and self.collected == self.created
        if self.retired or spent or (
            self.log_frequency and len(self.stream) >= self.log_frequency
        ):
            self.flush(indexed=not self.retired or self.log_frequency != 0)

    def flush(self, indexed: bool) -> None:
        if self.stream:
            traces, self.stream = self.stream, []
            self.file.save(traces, indexed)

    def retire(self) -> None:
        """Replaced (or the server stops): what it holds goes out now, and so does every
        trace it sampled that finishes later."""
        self.retired = True
        self.flush(indexed=self.log_frequency != 0)

    def answer(self, options: tuple[tuple[str, str], ...]) -> dict[str, Any]:
        answer: dict[str, Any] = {
            "trace_level": [level for level in LEVELS if level in self.level] or ["OFF"],
            "trace_rate": str(self.rate),
            "trace_count": str(self.count),
        }
        if self.mode == "triton":
            answer["log_frequency"] = str(self.log_frequency)
            answer["trace_file"] = self.file.path
        answer["trace_mode"] = self.mode
        for key, value in options:
            answer[key] = value
        return answer


class TraceManager:
    def __init__(self, config: TraceConfig) -> None:
        self._config = config
        self._file = triton_file.TraceFile(config.file)
        self._exporter = OtelExporter(config) if config.mode == "opentelemetry" else None
        self._default = self._make(
            frozenset(config.level), config.rate, config.count, config.log_frequency,
            frozenset(),
        )
        self._global = self._make(
            frozenset(config.level), config.rate, config.count, config.log_frequency,
            frozenset(),
        )
        self._models: dict[str, _Setting] = {}
        self._ids = itertools.count(1)
        self.active = bool(config.level)

    def _make(
        self, level: frozenset[str], rate: int, count: int, frequency: int,
        specified: frozenset[str],
    ) -> _Setting:
        return _Setting(
            level, rate, count, frequency, specified, self._config.mode, self._file,
            self._exporter,
        )

    # --- requests -------------------------------------------------------------------------

    def start(
        self, model_name: str, version: int, request_id: str, context: TraceContext
    ) -> Trace | None:
        """The request's trace if it is sampled (call only while ``active``)."""
        setting = self._models.get(model_name, self._global)
        force = (
            setting.exporter is not None
            and bool(setting.level)
            and parent_ids(context.traceparent) is not None
        )
        if not setting.sample(force):
            return None
        trace = Trace(next(self._ids), model_name, version, request_id, context, setting.level)
        trace.sink = setting.write
        return trace

    def child(self, parent: Trace, model_name: str, version: int, request_id: str) -> Trace:
        """The trace of a step of the traced ensemble request ``parent``: its own id, written
        with the parent (Triton's ``parent_id``)."""
        trace = Trace(
            next(self._ids), model_name, version, request_id, parent.context, parent.level,
            parent_id=parent.id,
        )
        parent.children.append(trace)
        return trace

    # --- the trace setting requests -------------------------------------------------------

    def settings(self, model_name: str) -> dict[str, Any]:
        """Every setting of ``model_name`` ("": the global ones), as the answers show them."""
        options = tuple((k, v) for k, v in self._config.options)
        return self._models.get(model_name, self._global).answer(options)

    def update(self, model_name: str, changes: dict[str, Any]) -> None:
        """Apply checked changes (``server.tracing.api``): a value sets, ``CLEAR`` clears."""
        self._update(model_name, changes)
        if not model_name:
            # Models that follow the global setting in part take its new values.
            for name in list(self._models):
                self._update(name, {})
        self.active = any(s.level for s in (self._global, *self._models.values()))

    def _update(self, model_name: str, changes: dict[str, Any]) -> None:
        current = self._models.get(model_name) if model_name else self._global
        fallback = self._global if model_name else self._default
        values: dict[str, Any] = {
            "trace_level": fallback.level, "trace_rate": fallback.rate,
            "trace_count": fallback.count, "log_frequency": fallback.log_frequency,
        }
        own = {
            "trace_level": "level", "trace_rate": "rate", "trace_count": "count",
            "log_frequency": "log_frequency",
        }
        specified = set()
        for key in KEYS:
            if key in changes:
                if changes[key] is CLEAR:
                    continue
                values[key] = changes[key]
                specified.add(key)
            elif current is not None and key in current.specified:
                values[key] = getattr(current, own[key])
                specified.add(key)
        if model_name and not specified:
            dropped = self._models.pop(model_name, None)
            if dropped is not None:
                dropped.retire()
            return
        setting = self._make(
            frozenset(values["trace_level"]), values["trace_rate"], values["trace_count"],
            values["log_frequency"], frozenset(specified),
        )
        reason = setting.reason()
        if reason is not None and setting.level:
            raise InvalidArgument(f"Attempting to set invalid trace setting :{reason}")
        if current is not None:
            current.retire()
        if model_name:
            self._models[model_name] = setting
        else:
            self._global = setting

    def close(self) -> None:
        """The server stops: every trace held goes to its file, spans are sent."""
        for setting in (self._global, *self._models.values()):
            setting.retire()
        self._file.close()
        if self._exporter is not None:
            self._exporter.close()
