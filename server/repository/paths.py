"""Files a model configuration names, confined to the model's folders.

A config, from ``config.pbtxt`` or sent with a load request, names files: the model file
(``default_model_filename``, in each version folder) and label files (``label_filename``, in
the model folder, as Triton reads them). Each name must resolve, symbolic links included,
inside its folder, and name a regular file: ``../x``, ``/etc/passwd`` or a link leading out
would let a load request read any file of the host, and a FIFO, socket or device would hang
the load that opens it. Messages name the file as the config does, never a host path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from server.errors import ModelLoadError


def confined_file(
    folder: Path, name: str, what: str, model: str, label: str, inside: str
) -> Path | None:
    """``folder / name``, checked; None when there is no such file.

    ``what`` says which config field named it, ``label`` how messages show it (such as
    ``1/model.onnx``) and ``inside`` what the folder is to a user. Raises when the name
    leaves the folder or is not a regular file."""
    if not name or "\x00" in name or os.path.isabs(name):  # (an absolute name is not shown)
        raise ModelLoadError(
            f"unable to load model '{model}': {what} must be a relative path inside {inside}, "
            "not empty or absolute"
        )
    root = Path(os.path.realpath(folder))
    resolved = Path(os.path.realpath(folder / name))
    if resolved != root and root not in resolved.parents:
        raise ModelLoadError(
            f"unable to load model '{model}': {what} '{_shown(label)}' resolves outside {inside}"
        )
    return folder / name if regular_file(resolved, what, model, label) else None


def regular_file(path: Path, what: str, model: str, label: str) -> Path | None:
    """``path`` if it is a regular file (links followed), None if there is nothing there;
    raises for anything else, before it is opened (opening a FIFO would block)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:  # too long a name, a loop of links, no permission
        raise ModelLoadError(
            f"unable to load model '{model}': {what} '{_shown(label)}' cannot be read: "
            f"{exc.strerror}"
        ) from None
    if not stat.S_ISREG(mode):
        raise ModelLoadError(
            f"unable to load model '{model}': {what} '{_shown(label)}' is not a regular file"
        )
    return path


def _shown(label: str) -> str:
    return label if len(label) <= 200 else label[:200] + "..."
