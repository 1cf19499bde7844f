"""What ``tests.server_process`` notes for ``scripts/test.sh``'s second pass: the module of the
test running when a server follows ``TENSORGATE_TEST_FRONTENDS``, and of each test of the
session's ``server``."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests import conftest
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


def _item(nodeid: str, server_module: str | None) -> Any:
    """A stand-in for a collected test whose ``server`` fixture is defined in ``server_module``
    (None: it uses no fixture of that name)."""

    def fixture() -> None: ...

    definitions: dict[str, list[Any]] = {}
    if server_module is not None:
        fixture.__module__ = server_module
        definitions["server"] = [SimpleNamespace(func=fixture)]
    fixtures = SimpleNamespace(name2fixturedefs=definitions)
    return SimpleNamespace(nodeid=nodeid, _fixtureinfo=fixtures)


def test_only_the_sessions_server_notes_the_test_using_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A module's own ``server`` fixture is not the session's: its server notes itself when it
    follows the layout of the run (one with a ``--frontends`` of its own does not)."""
    log = tmp_path / "layouts"
    monkeypatch.setenv(LAYOUT_LOG, str(log))
    conftest.pytest_runtest_setup(_item("tests/a/test_session.py::t", conftest.__name__))
    conftest.pytest_runtest_setup(_item("tests/a/test_own.py::t", "tests.a.test_own"))
    conftest.pytest_runtest_setup(_item("tests/a/test_none.py::t", None))
    assert log.read_text().splitlines() == ["tests/a/test_session.py"]
