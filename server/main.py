"""The ``tensorgate`` command: parse the flags, then the server as processes (a supervisor,
one executor, front ends) or, with ``--frontends=0``, the one-process server.

Kept light: the supervisor must not import grpc, CuPy or ONNX Runtime (its children start as
fresh interpreters), so the one-process server is imported only when it is the one to run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from server import event_loop, logs
from server.cli import parse_settings


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point: ``tensorgate --model-repository=PATH ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    settings = parse_settings(args)
    logs.configure(settings)
    if settings.frontend_count() == 0:
        from server.app import serve

        return event_loop.run(serve(settings))
    from server.processes import supervisor

    return supervisor.run(settings, args)
