"""``python -m server.loadtest``: the same as the ``tensorgate-bench`` command."""

import sys

from server.loadtest.cli import main

if __name__ == "__main__":
    sys.exit(main())
