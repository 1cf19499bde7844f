"""The garbage collector, told once a process serves that its start-up objects stay, and (in
the executor) that requests in flight are not garbage.

Measured in a front end under perf_analyzer HTTP c=8 (about 6,000 requests each): one full
collection (generation 2) took 70-130 ms, walking every object of the process (grpc, protobuf
descriptors, numpy, Tornado): 12-22 µs per request amortised, and a stall that long for the
requests in flight. What exists once the process serves lives as long as the process, so it is
moved where the collector no longer walks it (``gc.freeze``); a full collection then took 1 ms.

Young collections start when allocations outnumber frees by a threshold (CPython's is 700).
The requests a dynamic batch holds (their tasks, futures, requests and jobs) pass that as a
batch fills, though nothing of theirs is a reference cycle: none was left for the collector
after 2,000 batched requests. In the executor under perf_analyzer (``mlp`` over gRPC at
concurrency 32, batching on) that made 20 young collections per 1,000 requests, 1.8 µs of its
CPU per request; with ``EXECUTOR_YOUNG_THRESHOLD`` there were none in the same run.

Only the executor waits longer. The front ends measured no collections to save (at most 0.05
per 1,000 requests), and what a client leaves may be cyclic garbage that only a collection
frees. Closed HTTP connections were such garbage, each with its 64 KiB read buffer: with this
threshold everywhere, a one-process server kept 17.6 MiB more after 600 refused requests on
fresh connections. ``HttpConnection`` now lets go of them itself; closed gRPC connections and
their calls were checked the same way and hold no cycle (a test guards each port).
"""

from __future__ import annotations

import gc

#: Allocations net of frees that start a young collection in the executor, once it serves.
EXECUTOR_YOUNG_THRESHOLD = 10_000


def settle(young_threshold: int | None = None) -> None:
    """Collect what start-up left behind and freeze the rest (call once, when serving); with
    ``young_threshold``, collect the young generation that much less often."""
    gc.collect()
    gc.freeze()
    if young_threshold is not None:
        _, middle, old = gc.get_threshold()
        gc.set_threshold(young_threshold, middle, old)
