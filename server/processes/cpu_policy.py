"""The executor and the front ends run under Linux's ``SCHED_BATCH`` CPU policy, not the default.

In the split layout every small request is handed between processes three times (a front end
parses it, the executor runs it, the front end writes the answer), each hand-off a write that
wakes the other process. Under the default policy the woken process preempts the writer on
its core while the writer still has the rest of its read to serve: on 2 cores, with the client
as a fourth busy process, the executor was preempted 0.08-0.20 times per request. A woken
``SCHED_BATCH`` thread does not preempt the running one; it runs when the writer blocks or
its slice ends (sched(7)). The weight is that of nice 0, so each process gets the same share
of the CPU as before, and processes outside the server (the client) still preempt it.
Measured under perf_analyzer, 2 front ends, rounds alternating: simple over HTTP at c=8
5,366 → 5,674/s (medians of 6), the executor preempted 0.02-0.04 times per request, the
server's CPU 254 → 247 µs per request; simple over gRPC at c=8 5,634 → 5,680/s and mlp over
gRPC at c=32 8,281 → 8,196/s (medians of 3: unchanged). The one-process layout gained
nothing (6,389 → 6,481/s) and keeps the default policy.

Switching to ``SCHED_BATCH`` needs no privilege. Where the platform has no such policy or a
sandbox forbids the call, the process goes on under its policy as it is; so does a process
started under a policy other than the default (``chrt``, a container runtime's setting), which
somebody chose on purpose.
"""

from __future__ import annotations

import logging
import os

log = logging.getLogger("server")

_TASKS = "/proc/self/task"


def use_batch_policy() -> bool:
    """Put every thread of this process under ``SCHED_BATCH`` (threads started later inherit
    it from their creator); False where that is not possible here, or the process was started
    under another policy than the default."""
    policy = getattr(os, "SCHED_BATCH", None)
    if policy is None:
        return False
    try:
        if os.sched_getscheduler(0) != os.SCHED_OTHER:  # chosen for the server: kept
            return False
        for task in os.listdir(_TASKS):
            try:
                os.sched_setscheduler(int(task), policy, os.sched_param(0))
            except ProcessLookupError:  # a thread that ended meanwhile
                continue
    except OSError as exc:
        log.debug("staying on the default CPU scheduling policy: %s", exc)
        return False
    return True
