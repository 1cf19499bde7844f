"""What ``tests.server_process`` notes for ``scripts/test.sh``'s second pass: the module of the
test running when a server follows ``TENSORGATE_TEST_FRONTENDS``."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.server_process import LAYOUT_LOG, record_layout_module


def test_the_running_tests_module_is_noted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "layouts"
    monkeypatch.setenv(LAYOUT_LOG, str(log))
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "tests/server/http/test_x.py::test_y[a::b] (setup)")
    record_layout_module()
    record_layout_module("tests/server/grpc/test_z.py::test_w")
    assert log.read_text().splitlines() == [
        "tests/server/http/test_x.py", "tests/server/grpc/test_z.py",
    ]


def test_nothing_is_noted_without_a_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(LAYOUT_LOG, raising=False)
    monkeypatch.chdir(tmp_path)
    record_layout_module("tests/server/http/test_x.py::test_y")
    assert list(tmp_path.iterdir()) == []
