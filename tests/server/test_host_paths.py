"""Unit tests for server.host_paths: library messages reach clients without host paths."""

from __future__ import annotations

from pathlib import Path

from server.host_paths import redact_paths


def test_the_version_folder_becomes_model_and_version(tmp_path: Path) -> None:
    folder = tmp_path / "repo" / "m" / "1"
    text = f"Load model from {folder}/model.onnx failed: Protobuf parsing failed."
    assert redact_paths(text, folder, "m/1") == (
        "Load model from m/1/model.onnx failed: Protobuf parsing failed."
    )


def test_the_resolved_folder_too(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    text = f"bad file {tmp_path / 'real'}/x.bin"
    assert redact_paths(text, tmp_path / "link", "m/1") == "bad file m/1/x.bin"


def test_other_absolute_paths_are_hidden_relative_ones_kept() -> None:
    text = (
        'External data path: "../../secret.bin" resolved path: "/srv/secret.bin" allowed '
        "directory: /srv/models/m/1 (1/model.onnx, a/b, 3/4)"
    )
    assert redact_paths(text, Path("/elsewhere"), "m/1") == (
        'External data path: "../../secret.bin" resolved path: "<path>" allowed directory: '
        "<path> (1/model.onnx, a/b, 3/4)"
    )
