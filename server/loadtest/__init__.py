"""``tensorgate-bench``: a closed-loop concurrency sweep against any KServe V2 / Triton server.

For users without perf_analyzer. Modules, in the order a run uses them: ``cli`` (flags),
``server_api`` (metadata, config, statistics over HTTP or gRPC), ``inputs`` (tensors from the
metadata or a file), ``encoding`` (requests encoded once), ``workers`` and ``clients`` (the load,
in client processes), ``sweep`` (one step per concurrency), ``measurements`` (percentiles and
the statistics delta) and ``report`` (table, CSV, PNG).

The modules that client processes import (``clients``, ``workers``, ``measurements``) need
neither numpy nor matplotlib, so a worker starts quickly and stays small.
"""
