"""Unit tests for server.repository.overrides: model name checks (Triton's texts, triton-facts
§7.5) and the private folder that holds a load request's file overrides."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest

from server.errors import InternalError, InvalidArgument
from server.repository.overrides import OverrideFolder, check_model_name

TRAVERSAL = "model name must not contain path traversal characters"
EMPTY = "Model name cannot be empty. Please enter a valid name to deploy."


# ---- check_model_name --------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["../etc", "a/../b", "/etc/passwd", "model/", " ..", "..", ".", ".. ", "a\\b", "..\\x",
     "a\x00b", "x/y"],
)
def test_traversal_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_model_name(name)
    assert caught.value.message == TRAVERSAL


@pytest.mark.parametrize("name", ["", " ", "\t", "  \n "])
def test_empty_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        check_model_name(name)
    assert caught.value.message == EMPTY


@pytest.mark.parametrize(
    "name", ["model.version1", "...", "..my_model", "model..1", "simple", "a b", "m-1_x"]
)
def test_odd_but_valid_names_pass(name: str) -> None:
    check_model_name(name)  # no exception


# ---- OverrideFolder ------------------------------------------------------------------------


def test_files_are_written_under_a_private_model_folder(private_tmp: Path) -> None:
    files = {"file:1/model.onnx": b"onnx bytes", "file:config.pbtxt": b"max_batch_size: 1\n"}
    folder = OverrideFolder("mymodel", files)
    try:
        assert folder.model_dir.name == "mymodel"
        assert folder.model_dir.parent.parent == private_tmp
        assert folder.model_dir.parent.name.startswith("tensorgate-override-")
        assert (folder.model_dir / "1" / "model.onnx").read_bytes() == b"onnx bytes"
        assert (folder.model_dir / "config.pbtxt").read_bytes() == b"max_batch_size: 1\n"
        written = sorted(
            str(p.relative_to(folder.model_dir)) for p in folder.model_dir.rglob("*") if p.is_file()
        )
        assert written == ["1/model.onnx", "config.pbtxt"]
    finally:
        folder.remove()


def test_two_loads_get_two_folders(private_tmp: Path) -> None:
    first = OverrideFolder("m", {"file:1/model.onnx": b"a"})
    second = OverrideFolder("m", {"file:1/model.onnx": b"b"})
    try:
        assert first.model_dir != second.model_dir
        assert (first.model_dir / "1" / "model.onnx").read_bytes() == b"a"
        assert (second.model_dir / "1" / "model.onnx").read_bytes() == b"b"
    finally:
        first.remove()
        second.remove()


def test_remove_deletes_everything_and_is_idempotent(private_tmp: Path) -> None:
    folder = OverrideFolder("m", {"file:1/model.onnx": b"x", "file:2/sub/dir/f": b"y"})
    assert list(private_tmp.iterdir())
    folder.remove()
    assert list(private_tmp.iterdir()) == []
    folder.remove()  # a second remove is harmless
    assert list(private_tmp.iterdir()) == []


@pytest.mark.parametrize(
    "key",
    [
        "file:../x",
        "file:/abs",
        "file:1/../../x",
        "file:1/../x",
        "file:./1/model.onnx",
        "file:1//model.onnx",
        "file:1/model.onnx/",
        "file:",
        "file:..",
        "file:1\\..\\..\\x",
        "file:1/mo\x00del.onnx",
    ],
)
def test_escaping_paths_are_refused_and_nothing_is_written(
    private_tmp: Path, tmp_path: Path, key: str
) -> None:
    before = sorted(tmp_path.rglob("*"))
    with pytest.raises(InvalidArgument) as caught:
        OverrideFolder("m", {"file:1/model.onnx": b"good", key: b"evil"})
    assert "invalid file override path" in caught.value.message
    assert sorted(tmp_path.rglob("*")) == before  # no folder left behind, nothing outside


@pytest.mark.parametrize("name", ["../etc", "a/b", "", " "])
def test_folder_refuses_bad_model_names(private_tmp: Path, name: str) -> None:
    with pytest.raises(InvalidArgument):
        OverrideFolder(name, {"file:1/model.onnx": b"x"})
    assert list(private_tmp.iterdir()) == []


def test_a_failed_write_removes_the_folder(private_tmp: Path) -> None:
    """``1/model.onnx`` is written as a file, so ``1/model.onnx/inner`` cannot be: the
    half-written folder is removed and the client told which override it was (a 400 that
    does not show the private folder)."""
    with pytest.raises(InvalidArgument) as caught:
        OverrideFolder("m", {"file:1/model.onnx": b"x", "file:1/model.onnx/inner": b"y"})
    assert caught.value.message.startswith("invalid file override 'file:1/model.onnx/inner': ")
    assert str(private_tmp) not in caught.value.message
    assert list(private_tmp.iterdir()) == []


@pytest.mark.parametrize(
    "key", ["file:1/" + "a" * 256, "file:" + "/".join(["d" * 200] * 21), "file:" + "é" * 128]
)
def test_names_too_long_for_the_file_system_are_refused(private_tmp: Path, key: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        OverrideFolder("m", {key: b"x"})
    assert "each name in it may have at most 255 bytes, and the whole path at most 4096" in (
        caught.value.message
    )
    assert list(private_tmp.iterdir()) == []
    OverrideFolder("m", {"file:1/" + "a" * 255: b"x"}).remove()  # 255 bytes is a name


def test_long_model_names_and_too_many_files_are_refused(private_tmp: Path) -> None:
    with pytest.raises(InvalidArgument, match="longer than the 255 bytes a folder name may have"):
        check_model_name("m" * 256)
    check_model_name("m" * 255)
    with pytest.raises(InvalidArgument, match="at most 1024 file overrides, not 1025"):
        OverrideFolder("m", {f"file:1/{i}": b"" for i in range(1025)})
    assert list(private_tmp.iterdir()) == []


def test_other_write_failures_are_server_errors_without_the_folder(
    private_tmp: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(self: Path, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device", str(self))

    monkeypatch.setattr(Path, "write_bytes", full)
    with pytest.raises(InternalError) as caught:
        OverrideFolder("m", {"file:1/model.onnx": b"x"})
    assert caught.value.message == (
        "unable to write file override 'file:1/model.onnx': No space left on device"
    )
    assert list(private_tmp.iterdir()) == []
