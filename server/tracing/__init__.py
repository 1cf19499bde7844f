"""Triton's trace extension: sampled inference requests written as Triton's JSON trace file
(``triton`` mode) or exported as OpenTelemetry spans (``opentelemetry`` mode).

``config`` reads ``--trace-config`` (and the deprecated ``--trace-*`` flags); ``api`` checks
the trace setting requests (``/v2[/models/<m>]/trace/setting``, ``TraceSetting``);
``manager`` holds the global and per-model settings and samples requests; ``record`` is one
request's trace; ``triton_file`` and ``otel`` write traces out. Everything but ``config`` and
``context`` lives in the process that runs models (the executor).
"""
