"""``python -m server``: the same as the ``tensorgate`` command."""

import sys

from server.main import main

if __name__ == "__main__":
    sys.exit(main())
