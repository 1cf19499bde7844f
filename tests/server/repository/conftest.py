"""Fixtures shared by the repository tests."""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from backends.onnxruntime.backend import OnnxRuntimeBackend
from backends.python.backend import PythonBackend
from server.repository.loader import Model, load_model
from server.settings import Settings

BACKENDS = {
    "onnxruntime": OnnxRuntimeBackend({"intra_op_thread_count": "1"}),
    "python": PythonBackend(),
}


@pytest.fixture
def private_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Temporary folders (file override folders) are made under ``tmp_path/tmp``, where the
    test can list them."""
    root = tmp_path / "tmp"
    root.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(root))
    return root


@pytest.fixture
def load(tmp_path: Path) -> Iterator[Callable[..., Model]]:
    """``load(name, settings=None, gpu_count=0)`` loads ``tmp_path/name``; the schedulers of
    what it loaded are closed afterwards."""
    loaded: list[Model] = []

    def _load(name: str, settings: Settings | None = None, gpu_count: int = 0) -> Model:
        model = load_model(tmp_path / name, BACKENDS, settings or Settings(), gpu_count=gpu_count)
        loaded.append(model)
        return model

    yield _load
    for model in loaded:
        for version in model.versions.values():
            if version.scheduler is not None:
                version.scheduler.close()
