"""The errors a user sees as one line: the command line prints them and exits, no traceback."""

from __future__ import annotations


class BenchError(Exception):
    """Something the user can fix or has to know (the server, the model, the data): exit 1."""

    exit_code = 1


class UsageError(BenchError):
    """Flags that cannot work together or with this model: exit 2, as argparse does."""

    exit_code = 2
