"""``python -m tests.server.processes.run_supervisor <argv>``: the supervisor of the
``tensorgate`` command, with ``fake_child`` as both the executor and the front ends."""

from __future__ import annotations

import sys

from server import logs
from server.cli import parse_settings
from server.processes import supervisor

FAKE = "tests.server.processes.fake_child"

if __name__ == "__main__":
    argv = sys.argv[1:]
    settings = parse_settings(argv)
    logs.configure(settings)
    sys.exit(supervisor.run(settings, argv, child_modules=(FAKE, FAKE)))
