"""Models loaded with file overrides live in a private temporary folder, never in the user's
repository. Override paths are confined to that folder."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from server.errors import InvalidArgument

FILE_PREFIX = "file:"


def check_model_name(name: str) -> None:
    """Refuse names that are empty or could leave the repository folder (Triton's texts)."""
    if not name.strip():
        raise InvalidArgument("Model name cannot be empty. Please enter a valid name to deploy.")
    stripped = name.strip()
    if "/" in name or "\\" in name or "\x00" in name or stripped in (".", ".."):
        raise InvalidArgument("model name must not contain path traversal characters")


def _relative_path(key: str) -> PurePosixPath:
    text = key[len(FILE_PREFIX) :]
    path = PurePosixPath(text)
    if (
        not text
        or "\x00" in text
        or "\\" in text
        or path.is_absolute()
        or any(part in ("", ".", "..") for part in text.split("/"))
    ):
        raise InvalidArgument(
            f"invalid file override path '{text[:200]}': it must be a relative path such as "
            "'1/model.onnx' without '.' or '..' parts"
        )
    return path


class OverrideFolder:
    """A temporary model folder holding the files of one load request."""

    def __init__(self, model_name: str, files: Mapping[str, bytes]) -> None:
        check_model_name(model_name)
        paths = {key: _relative_path(key) for key in files}
        self._root = Path(tempfile.mkdtemp(prefix="tensorgate-override-"))
        self.model_dir = self._root / model_name
        try:
            for key, relative in paths.items():
                target = self.model_dir.joinpath(*relative.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(files[key])
        except OSError:
            self.remove()
            raise

    def remove(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)
