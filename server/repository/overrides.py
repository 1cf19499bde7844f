"""Models loaded with file overrides live in a private temporary folder, never in the user's
repository. Override paths are confined to that folder."""

from __future__ import annotations

import errno
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path, PurePosixPath

from server.errors import InternalError, InvalidArgument

FILE_PREFIX = "file:"
#: Files one load request may carry (each is written to disk).
MAX_FILES = 1024
#: What Linux file systems take: a name of at most 255 bytes, a path of at most 4096.
MAX_NAME_BYTES = 255
MAX_PATH_BYTES = 4096
#: Errors a request's own file names cause: a name used as both a file and a folder.
_CLIENT_ERRNOS = frozenset({errno.EEXIST, errno.ENOTDIR, errno.EISDIR})


def check_model_name(name: str) -> None:
    """Refuse names that are empty or could leave the repository folder (Triton's texts)."""
    if not name.strip():
        raise InvalidArgument("Model name cannot be empty. Please enter a valid name to deploy.")
    stripped = name.strip()
    if "/" in name or "\\" in name or "\x00" in name or stripped in (".", ".."):
        raise InvalidArgument("model name must not contain path traversal characters")
    if len(name.encode(errors="surrogatepass")) > MAX_NAME_BYTES:
        raise InvalidArgument(
            f"model name '{name[:200]}...' is longer than the {MAX_NAME_BYTES} bytes a folder "
            "name may have"
        )


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
    if len(text.encode(errors="surrogatepass")) > MAX_PATH_BYTES or any(
        len(part.encode(errors="surrogatepass")) > MAX_NAME_BYTES for part in path.parts
    ):
        raise InvalidArgument(
            f"invalid file override path '{text[:200]}...': each name in it may have at most "
            f"{MAX_NAME_BYTES} bytes, and the whole path at most {MAX_PATH_BYTES}"
        )
    return path


class OverrideFolder:
    """A temporary model folder holding the files of one load request."""

    def __init__(self, model_name: str, files: Mapping[str, bytes]) -> None:
        check_model_name(model_name)
        if len(files) > MAX_FILES:
            raise InvalidArgument(
                f"a load request may carry at most {MAX_FILES} file overrides, not {len(files)}"
            )
        paths = {key: _relative_path(key) for key in files}
        self._root = Path(tempfile.mkdtemp(prefix="tensorgate-override-"))
        self.model_dir = self._root / model_name
        key = ""
        try:
            for key, relative in paths.items():
                target = self.model_dir.joinpath(*relative.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(files[key])
        except OSError as exc:
            self.remove()
            # The message names the override, never the private folder it was written to.
            if exc.errno in _CLIENT_ERRNOS:
                raise InvalidArgument(
                    f"invalid file override '{key[:200]}': {exc.strerror}: another override "
                    "uses one of its folders as a file, or it as a folder"
                ) from None
            raise InternalError(
                f"unable to write file override '{key[:200]}': {exc.strerror}"
            ) from None

    def remove(self) -> None:
        shutil.rmtree(self._root, ignore_errors=True)
