"""The ``tensorgate`` command: parse the flags, then the server as processes (a supervisor,
one executor, front ends) or, with ``--frontends=0``, the one-process server.

Kept light: the supervisor must not import grpc, CuPy or ONNX Runtime (its children start as
fresh interpreters), so the one-process server is imported only when it is the one to run.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Sequence

from server import event_loop, logs
from server.cli import parse_command_line

log = logging.getLogger("server")


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point of ``tensorgate`` and ``tritonserver``:
    ``tensorgate --model-repository=PATH ...``. The warnings about tritonserver options
    without effect are logged here, once: the children re-read the same flags in silence."""
    args = list(sys.argv[1:] if argv is None else argv)
    command_line = parse_command_line(args)
    settings = command_line.settings
    logs.configure(settings)
    for warning in command_line.warnings:
        log.warning("%s", warning)
    if settings.frontend_count() == 0:
        from server.app import serve

        return event_loop.run(serve(settings))
    from server.processes import supervisor

    return supervisor.run(settings, args)
