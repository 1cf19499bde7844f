"""Unit tests for server.repository.paths: names a config gives must stay inside their folder
and be regular files (a FIFO would hang the load that opens it)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from server.errors import ModelLoadError
from server.repository.paths import confined_file, regular_file

INSIDE = "the model's version folder"


def _check(folder: Path, name: str) -> Path | None:
    return confined_file(folder, name, "model file", "m", f"1/{name}", INSIDE)


@pytest.fixture
def version(tmp_path: Path) -> Path:
    folder = tmp_path / "repo" / "m" / "1"
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"model")
    (tmp_path / "secret.onnx").write_bytes(b"secret")
    return folder


def test_a_plain_file_inside_is_taken(version: Path) -> None:
    assert _check(version, "model.onnx") == version / "model.onnx"
    (version / "sub").mkdir()
    (version / "sub" / "x.onnx").write_bytes(b"x")
    assert _check(version, "sub/x.onnx") == version / "sub" / "x.onnx"
    assert _check(version, "sub/../model.onnx") == version / "sub/../model.onnx"


def test_a_missing_file_is_none(version: Path) -> None:
    assert _check(version, "other.onnx") is None


@pytest.mark.parametrize(
    "name", ["../../../secret.onnx", "../model.onnx", "sub/../../model.onnx", ".."]
)
def test_names_that_climb_out_are_refused(version: Path, name: str) -> None:
    with pytest.raises(ModelLoadError, match=f"resolves outside {INSIDE}"):
        _check(version, name)


def test_absolute_and_empty_names_are_refused(version: Path, tmp_path: Path) -> None:
    for name in (str(tmp_path / "secret.onnx"), "/etc/passwd", "", "a\x00b"):
        with pytest.raises(ModelLoadError, match=f"model file must be a relative path inside {INSIDE}, not empty or absolute"):
            _check(version, name)


def test_links_leading_out_are_refused_and_links_inside_taken(
    version: Path, tmp_path: Path
) -> None:
    (version / "out.onnx").symlink_to(tmp_path / "secret.onnx")
    (version / "dir").symlink_to(tmp_path)
    (version / "in.onnx").symlink_to(version / "model.onnx")
    for name in ("out.onnx", "dir/secret.onnx"):
        with pytest.raises(ModelLoadError, match="resolves outside"):
            _check(version, name)
    assert _check(version, "in.onnx") == version / "in.onnx"


def test_a_version_folder_that_is_a_link_is_its_target(tmp_path: Path) -> None:
    """The operator may link a version folder to where the files are: the file is checked
    against where the folder leads."""
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "model.onnx").write_bytes(b"m")
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "1").symlink_to(tmp_path / "store")
    assert _check(tmp_path / "m" / "1", "model.onnx") == tmp_path / "m" / "1" / "model.onnx"


def test_fifos_sockets_devices_and_folders_are_refused_without_opening(
    version: Path,
) -> None:
    os.mkfifo(version / "fifo.onnx")  # opening it for reading would block forever
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(version / "sock.onnx"))
        (version / "dev.onnx").symlink_to("/dev/zero")
        (version / "dir.onnx").mkdir()
        for name in ("fifo.onnx", "sock.onnx", "dir.onnx"):
            with pytest.raises(ModelLoadError, match=f"'1/{name}' is not a regular file"):
                _check(version, name)
        with pytest.raises(ModelLoadError, match="resolves outside"):
            _check(version, "dev.onnx")
    with pytest.raises(ModelLoadError, match="is not a regular file"):
        regular_file(Path("/dev/null"), "the config", "m", "config.pbtxt")


def test_messages_show_no_host_path(version: Path) -> None:
    with pytest.raises(ModelLoadError) as caught:
        _check(version, "../../../secret.onnx")
    assert str(version.parent.parent) not in caught.value.message
    with pytest.raises(ModelLoadError) as caught:
        _check(version, "x" * 300)  # too long a name for the file system
    assert "cannot be read: File name too long" in caught.value.message
    assert str(version) not in caught.value.message
