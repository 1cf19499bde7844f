"""Unit tests for server.repository.labels: label files read as Triton reads them."""

from __future__ import annotations

from pathlib import Path

import pytest
from google.protobuf import text_format

from server.errors import ModelLoadError
from server.generated import model_config_pb2 as mc
from server.repository import labels as labels_module
from server.repository.labels import read_labels


def _config(**label_files: str) -> mc.ModelConfig:
    outputs = "".join(
        f'output {{ name: "{name}" data_type: TYPE_FP32 dims: [ 4 ] label_filename: "{file}" }}'
        for name, file in label_files.items()
    )
    return text_format.Parse(
        f'name: "m" output {{ name: "PLAIN" data_type: TYPE_FP32 dims: [ 4 ] }} {outputs}',
        mc.ModelConfig(),
    )


def test_lines_become_labels_byte_for_byte(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"apple\n\npear\r\nplum")  # no newline after the last
    (tmp_path / "b.txt").write_bytes("caf\u00e9\n".encode())
    got = read_labels(_config(A="a.txt", B="b.txt"), tmp_path)
    # only the newline ends a line: an empty line is an empty label, a CR stays
    assert got == {"A": (b"apple", b"", b"pear\r", b"plum"), "B": ("caf\u00e9".encode(),)}


def test_no_label_file_means_no_entry(tmp_path: Path) -> None:
    assert read_labels(_config(), tmp_path) == {}


def test_an_empty_label_file_gives_no_labels(tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_bytes(b"")
    assert read_labels(_config(A="a.txt"), tmp_path) == {"A": ()}


def test_a_missing_label_file_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="label file 'x.txt' of output 'A' not found"):
        read_labels(_config(A="x.txt"), tmp_path)


def test_a_label_file_over_the_limit_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(labels_module, "MAX_LABEL_FILE_BYTES", 8)
    (tmp_path / "a.txt").write_bytes(b"123456789")
    with pytest.raises(ModelLoadError, match="'a.txt' is larger than 8 bytes"):
        read_labels(_config(A="a.txt"), tmp_path)
