"""Keeping host paths out of what clients read.

Libraries put file names in their errors (ONNX Runtime names the model file and where its
external data points; a user's ``open()`` names what it opened). Those messages reach clients
in load failures and the repository index, which must not show where the repository lives.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

# An absolute path in a message: a slash that does not continue a word or a relative path.
_ABSOLUTE_PATH = re.compile(r"(?<![\w.\-/])/[^\s\"'`,;:()\[\]{}<>]+")


def redact_paths(text: str, folder: Path, shown_as: str) -> str:
    """``text`` (a library's error message) fit for a client: ``folder``, as given or resolved,
    becomes ``shown_as``, and any other absolute path becomes ``<path>``."""
    for form in sorted({str(folder), os.path.realpath(folder)}, key=len, reverse=True):
        text = text.replace(form, shown_as)
    return _ABSOLUTE_PATH.sub("<path>", text)
