"""OpenTelemetry mode: each trace as Triton's spans, exported over OTLP/HTTP by a batch
span processor (its own thread).

The spans (``docs/user_guide/trace.md``): ``InferRequest``, the top-level span, with the
transport's receive and send timestamps as events; under it a span named after the model
(attributes ``triton.model_name``, ``triton.model_version``, ``triton.trace_id``,
``triton.trace_parent_id``, ``triton.request_id``) with the request's events
(``REQUEST_START``, ``QUEUE_START``, ``REQUEST_END``...); under that a ``compute`` span with
the ``COMPUTE_*`` events; an ensemble's steps are model spans under the ensemble's. A
request whose ``traceparent`` is valid continues that trace: the
top-level span's parent is the caller's span, so the trace id is the caller's. Span times are
wall-clock (monotonic stamps shifted by the offset taken at start, as Triton does).

The SDK is imported only when this mode is chosen.
"""

from __future__ import annotations

import time
from typing import Any

from server.tracing.config import DEFAULT_OTEL_URL, TraceConfig
from server.tracing.context import parent_ids
from server.tracing.record import Trace

_TRACER = "triton-server"


class OtelExporter:
    def __init__(self, config: TraceConfig) -> None:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        self._provider = TracerProvider(resource=Resource.create(config.resources()))
        self._provider.add_span_processor(
            BatchSpanProcessor(
                OTLPSpanExporter(endpoint=config.option("url", DEFAULT_OTEL_URL)),
                max_queue_size=int(config.option("bsp_max_queue_size", "2048")),
                schedule_delay_millis=float(config.option("bsp_schedule_delay", "5000")),
                max_export_batch_size=int(config.option("bsp_max_export_batch_size", "512")),
            )
        )
        self._tracer = self._provider.get_tracer(_TRACER)
        self._offset = time.time_ns() - time.perf_counter_ns()

    def export(self, trace: Trace, send_start: int, send_end: int) -> None:
        """Turn the finished trace into its spans; the processor sends them later."""
        from opentelemetry import trace as api

        wall = self._offset
        server = api.SpanKind.SERVER
        before, after = trace.front_end_stamps(send_start, send_end)
        parent = _remote_parent(trace.context.traceparent)
        root = self._tracer.start_span(
            "InferRequest", context=parent, kind=server, start_time=wall + before[0][1]
        )
        for name, ns in before:
            root.add_event(name, timestamp=wall + ns)
        self._model_spans(trace, root, before[-1][1])
        for name, ns in after:
            root.add_event(name, timestamp=wall + ns)
        root.end(end_time=wall + (after[-1][1] if after else time.perf_counter_ns()))

    def _model_spans(self, trace: Trace, parent: Any, received: int) -> None:
        """The model span of ``trace`` under ``parent``, its compute span, and its ensemble
        steps' model spans under it."""
        from opentelemetry import trace as api

        wall = self._offset
        server = api.SpanKind.SERVER
        stamps = dict(trace.timestamps)
        start = stamps.get("REQUEST_START", received)
        attributes: dict[str, Any] = {
            "triton.model_name": trace.model_name,
            "triton.model_version": trace.model_version,
            "triton.trace_id": trace.id,
            "triton.trace_parent_id": trace.parent_id,
        }
        if trace.request_id:
            attributes["triton.request_id"] = trace.request_id
        model = self._tracer.start_span(
            trace.model_name, context=api.set_span_in_context(parent), kind=server,
            start_time=wall + start, attributes=attributes,
        )
        for child in trace.children:
            self._model_spans(child, model, start)
        compute = None
        for name, ns in trace.timestamps:
            if name == "COMPUTE_START":
                compute = self._tracer.start_span(
                    "compute", context=api.set_span_in_context(model), kind=server,
                    start_time=wall + ns,
                )
            (compute if compute is not None and name.startswith("COMPUTE") else model).add_event(
                name, timestamp=wall + ns
            )
            if name == "COMPUTE_END" and compute is not None:
                compute.end(end_time=wall + ns)
                compute = None
        if compute is not None:  # (a failed request may stop mid-compute)
            compute.end(end_time=wall + trace.timestamps[-1][1])
        model.end(end_time=wall + stamps.get("REQUEST_END", trace.timestamps[-1][1]))

    def close(self) -> None:
        """Send what is queued, then stop the processor's thread."""
        self._provider.shutdown()


def _remote_parent(traceparent: str) -> Any:
    """The context a ``traceparent`` carries (None: no valid one, a new trace)."""
    ids = parent_ids(traceparent)
    if ids is None:
        return None
    from opentelemetry import trace as api

    trace_id, span_id, flags = ids
    span = api.NonRecordingSpan(
        api.SpanContext(trace_id, span_id, is_remote=True, trace_flags=api.TraceFlags(flags))
    )
    return api.set_span_in_context(span)
